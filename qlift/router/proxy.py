"""One upstream attempt: send a request to a backend and, unless it failed before its first
byte, pass the answer to the client (SSE chunk by chunk, unbuffered)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from qlift.router.balancer import Backend


def error_body(message: str, type_: str, code: int | str) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "code": code}}


@dataclass
class Attempt:
    backend: str
    stream: bool
    started: float = field(default_factory=time.monotonic)
    status: int = 0  # 0 = no answer (connection error or timeout)
    error: str | None = None
    responded: bool = False  # a byte went to the client: never replay after this
    completed: bool = False  # the whole answer went through
    client_disconnected: bool = False
    ttfb_s: float | None = None
    latency_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    upstream_body: bytes = b""  # kept for a failure that is handed to the client as it came
    upstream_content_type: str = "application/json"
    connect_failed: bool = False
    dropped: bool = False  # the backend closed the connection before answering (a stale pooled one, usually)
    response: web.StreamResponse | None = None  # what the client got, once responded

    @property
    def failed_early(self) -> bool:
        """Failed before any byte reached the client, in a way another backend may not: replayable."""
        return not self.responded and not self.client_disconnected and (self.status == 0 or self.status >= 500)

    @property
    def ok(self) -> bool:
        """The backend did its part (a client that left early does not count against it)."""
        if self.client_disconnected:
            return self.error is None and (self.status == 0 or 200 <= self.status < 300)
        return self.completed and 200 <= self.status < 300

    def take_usage(self, event: dict[str, Any]) -> None:
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
        for choice in event.get("choices") or []:
            reason = choice.get("finish_reason") if isinstance(choice, dict) else None
            if reason:
                self.finish_reason = reason


class SseScanner:
    """Picks usage and finish_reason out of an SSE stream without parsing every chunk."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.done = False
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        lines = (self._tail + chunk).split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            if line.startswith(b"data: [DONE]"):
                self.done = True
            elif b'"usage":{' in line or b'"usage": {' in line or (
                b'"finish_reason":' in line and b'"finish_reason":null' not in line
                and b'"finish_reason": null' not in line
            ):
                with contextlib.suppress(ValueError):
                    self.attempt.take_usage(json.loads(line[5:]))


def _response_headers(request_id: str, backend: Backend, content_type: str) -> dict[str, str]:
    return {"Content-Type": content_type, "X-Request-Id": request_id, "X-Qlift-Backend": backend.name}


async def attempt(request: web.Request, session: aiohttp.ClientSession, backend: Backend, payload: bytes, *,
                  stream: bool, request_id: str, first_byte_s: float, idle_s: float, att: Attempt) -> None:
    """Run one attempt, filling ``att``. Answers the client unless it failed early (status 0 or 5xx)."""
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
    upstream: aiohttp.ClientResponse | None = None
    try:
        try:
            async with asyncio.timeout(first_byte_s):
                upstream = await session.post(backend.url + request.path, data=payload, headers=headers)
                att.status = upstream.status
                if upstream.status != 200 or not stream:
                    att.ttfb_s = time.monotonic() - att.started  # the whole answer comes at once
                    body = await upstream.read()
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
            att.status, att.error = 0, f"connection failed: {type(exc).__name__}"
            att.connect_failed = isinstance(exc, aiohttp.ClientConnectorError)
            att.dropped = isinstance(exc, aiohttp.ServerDisconnectedError)
            return
        except TimeoutError:
            att.status, att.error = 0, f"no answer within {first_byte_s:g} s"
            return
        except aiohttp.ClientError as exc:
            att.status, att.error = 0, f"{type(exc).__name__}: {exc}"
            return
        content_type = upstream.headers.get("Content-Type", "application/json")
        if upstream.status != 200 or not stream:
            if upstream.status >= 500:
                att.error = f"HTTP {upstream.status}"
                att.upstream_body, att.upstream_content_type = body, content_type
                return
            if upstream.status == 200:
                with contextlib.suppress(ValueError):
                    att.take_usage(json.loads(body))
            else:
                att.error = f"HTTP {upstream.status}"
            att.responded = True
            att.response = web.Response(body=body, status=upstream.status,
                                        headers=_response_headers(request_id, backend, content_type))
            await att.response.prepare(request)
            await att.response.write_eof()
            att.completed = True
            return
        await _relay_stream(request, upstream, backend, request_id, content_type, idle_s, att)
    except asyncio.CancelledError:
        att.client_disconnected = True
        raise
    finally:
        att.latency_s = time.monotonic() - att.started
        if upstream is not None:
            if att.completed:
                upstream.release()
            else:  # drop the connection: vLLM sees the disconnect and aborts the request
                upstream.close()


async def _relay_stream(request: web.Request, upstream: aiohttp.ClientResponse, backend: Backend, request_id: str,
                        content_type: str, idle_s: float, att: Attempt) -> None:
    out = web.StreamResponse(status=200, headers={**_response_headers(request_id, backend, content_type),
                                                  "Cache-Control": "no-cache"})
    scanner = SseScanner(att)
    att.response = out
    try:
        await out.prepare(request)
        att.responded = True
        while True:
            try:
                async with asyncio.timeout(idle_s):
                    chunk = await upstream.content.readany()
            except (TimeoutError, aiohttp.ClientError) as exc:
                att.error = f"stream from backend broke: {type(exc).__name__}"
                message = f"backend {backend.name} stream broke: {type(exc).__name__}"
                event = json.dumps(error_body(message, "upstream_error", 502))
                await out.write(f"data: {event}\n\n".encode())
                break
            if not chunk:
                if not scanner.done:
                    att.error = "stream from backend ended without [DONE]"
                break
            if att.ttfb_s is None:  # a stream's first chunk: its first token, as the client sees it
                att.ttfb_s = time.monotonic() - att.started
            scanner.feed(chunk)
            await out.write(chunk)
        await out.write_eof()
        att.completed = att.error is None
    except ConnectionResetError:  # the client went away between two chunks
        att.client_disconnected = True
