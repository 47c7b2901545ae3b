"""Backends for the router's proxying tests that misbehave on purpose (what a real vLLM won't do on
demand), and nginx with gzip on in front of one.

``ScriptedBackend.mode`` picks what its completion routes answer:
  ok            - a proper answer (streamed: chunks, the usage chunk when asked, [DONE])
  not_json      - 200 with an HTML body
  error_object  - 200 with an OpenAI error object
  no_choices    - 200 with JSON that has no choices
  no_done       - a 200 stream that ends without [DONE]
  comments      - a 200 stream of SSE comments, one every 0.1 s, forever
Also /tokenize (echoes the model it got), /v1/responses and /v1/messages (their usage is
input_tokens/output_tokens, streamed or not; ``usage=False`` leaves it out), /v1/models (with root
and max_model_len, like vLLM), /health; with ``any_route``, every other POST route too (200, recorded).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web
from faults import ThreadedApp

from qlift.vllm.process import free_port


class ScriptedBackend(ThreadedApp):
    shutdown_timeout_s = 0.2

    def __init__(self, served_model: str, *, mode: str = "ok", tokens: int = 3, chunk_delay_s: float = 0.0,
                 port: int = 0, usage: bool = True,
                 any_route: bool = False, done_linger_s: float = 0.0) -> None:
        self.served_model = served_model
        self.usage = usage
        self.any_route = any_route
        self.mode = mode
        self.tokens = tokens
        self.chunk_delay_s = chunk_delay_s
        self.done_linger_s = done_linger_s  # between [DONE] and the end of the stream (vLLM's race, made wide)
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        super().__init__(port)

    # -- routes -------------------------------------------------------------------------

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.paths.append(request.path)
        chat = request.path.endswith("chat/completions")
        model = self.served_model
        usage = {"prompt_tokens": 5, "completion_tokens": self.tokens, "total_tokens": 5 + self.tokens}
        if self.mode == "not_json":
            return web.Response(text="<html>502 Bad Gateway</html>", content_type="application/json")
        if self.mode == "error_object":
            return web.json_response({"object": "error", "message": "engine dead", "type": "InternalError",
                                      "code": 500})
        if self.mode == "no_choices":
            return web.json_response({"id": "x", "object": "chat.completion", "model": model, "usage": usage})
        if not body.get("stream"):
            text = "hi " * self.tokens
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": text, "finish_reason": "length"})
            return web.json_response({"id": "x", "object": "chat.completion" if chat else "text_completion",
                                      "created": 1, "model": model, "choices": [choice], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if self.mode == "comments":
            while True:
                await resp.write(b": keep-alive\n\n")
                await asyncio.sleep(0.1)
        kind = "chat.completion.chunk" if chat else "text_completion"
        for i in range(self.tokens):
            last = i == self.tokens - 1
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
            if chat:
                choice["delta"] = {"content": "hi "} if i else {"role": "assistant", "content": "hi "}
            else:
                choice["text"] = "hi "
            chunk = {"id": "x", "object": kind, "created": 1, "model": model, "choices": [choice]}
            await resp.write(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode())
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
        if (body.get("stream_options") or {}).get("include_usage"):
            tail = {"id": "x", "object": kind, "created": 1, "model": model, "choices": [], "usage": usage}
            await resp.write(f"data: {json.dumps(tail, separators=(',', ':'))}\n\n".encode())
        if self.mode != "no_done":
            await resp.write(b"data: [DONE]\n\n")
            await asyncio.sleep(self.done_linger_s)
        await resp.write_eof()
        return resp

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.paths.append(request.path)
        if body.get("model", self.served_model) != self.served_model:
            return web.json_response({"error": {"message": "model not found", "code": 404}}, status=404)
        return web.json_response({"count": 3, "max_model_len": 2048, "tokens": [1, 2, 3], "model": self.served_model})

    async def _record(self, request: web.Request) -> dict[str, Any]:
        body = await request.json()
        self.bodies.append(body)
        self.paths.append(request.path)
        return body  # type: ignore[no-any-return]

    async def _sse(self, request: web.Request, events: list[tuple[str | None, dict[str, Any]]]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for name, data in events:
            head = f"event: {name}\n" if name else ""
            await resp.write(f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode())
        await resp.write_eof()
        return resp

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        usage = {"input_tokens": 5, "output_tokens": self.tokens, "total_tokens": 5 + self.tokens}
        done = {"id": "resp_1", "object": "response", "model": self.served_model, "status": "completed",
                "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}],
                **({"usage": usage} if self.usage else {})}
        if not body.get("stream"):
            return web.json_response(done)
        deltas = [("response.output_text.delta", {"type": "response.output_text.delta", "delta": "hi "})] * self.tokens
        return await self._sse(request, [("response.created", {"type": "response.created", "response": {
            "id": "resp_1", "model": self.served_model, "status": "in_progress"}}), *deltas,
            ("response.completed", {"type": "response.completed", "response": done})])

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        text = {"type": "text", "text": "hi " * self.tokens}
        if not body.get("stream"):
            usage = {"usage": {"input_tokens": 5, "output_tokens": self.tokens}} if self.usage else {}
            return web.json_response({"id": "msg_1", "type": "message", "role": "assistant", "model": self.served_model,
                                      "content": [text], "stop_reason": "max_tokens", **usage})
        start_usage = {"usage": {"input_tokens": 5, "output_tokens": 1}} if self.usage else {}
        end_usage = {"usage": {"output_tokens": self.tokens}} if self.usage else {}
        deltas = [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "text_delta", "text": "hi "}})] * self.tokens
        return await self._sse(request, [
            ("message_start", {"type": "message_start", "message": {"id": "msg_1", "model": self.served_model,
                                                                    "content": [], **start_usage}}), *deltas,
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, **end_usage}),
            ("message_stop", {"type": "message_stop"})])

    async def _any(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"object": "list", "model": self.served_model, "data": []})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.served_model, "object": "model", "created": 1, "owned_by": "vllm",
             "root": f"/models/{self.served_model}", "parent": None, "max_model_len": 2048}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    # -- lifecycle ----------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        if self.any_route:
            app.router.add_post("/{path:.*}", self._any)
        return app


NGINX = Path("/usr/sbin/nginx")


class GzipNginx:
    """nginx (Debian's) on 127.0.0.1 with ``gzip on`` for JSON and event streams, in front of ``upstream``."""

    def __init__(self, upstream: str, workdir: Path) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.dir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GzipNginx:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        temps = "\n".join(f"    {k}_temp_path {d}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (d / "nginx.conf").write_text(f"""
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log off;
{temps}
    gzip on;
    gzip_min_length 1;
    gzip_proxied any;
    gzip_types application/json text/event-stream;
    server {{
        listen 127.0.0.1:{self.port};
        location / {{
            proxy_pass http://{self.upstream};
            proxy_http_version 1.1;
            proxy_buffering off;
        }}
    }}
}}
""")
        self.proc = subprocess.Popen([str(NGINX), "-p", str(d), "-c", str(d / "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        import socket

        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.__exit__(None, None, None)
                    log = (d / "error.log").read_text(errors="replace")
                    raise RuntimeError(f"nginx did not start: {log}") from None
                time.sleep(0.05)

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
