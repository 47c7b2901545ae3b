"""One upstream attempt: send a request to a backend and, unless it failed before its first
byte, pass the answer to the client (SSE event by event, unbuffered).

An answer on a completion route is checked on its way: a non-streamed 200 must be JSON with
``choices`` (not an error object), a stream must end with ``[DONE]``. A non-streamed answer
that is not an answer is held back and replayed like a 5xx; a stream is checked as it passes
(its bytes are already the client's) and recorded as failed. With an answer filter (``answerfilter``),
an answer's text is checked too: cut before a blocked word, ``finish_reason`` ``content_filter``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from qlift.router.answerfilter import AnswerFilter, StreamFilter, filter_whole
from qlift.router.balancer import Backend
from qlift.router.config import redact_url
from qlift.router.memsize import compact_json
from qlift.router.rewrite import ModelRewriter, is_usage_only
from qlift.router.wire import USAGE_KEYS, ToolCall, ToolFunction

# A 200 that is not an answer, each its own reason (access log, records, metric label).
BAD_ANSWER = frozenset({"bad_body", "no_choices", "error_object", "no_done", "error_event"})
# Failed before the client got a byte, in a way another backend may not: replayable.
REPLAYABLE = BAD_ANSWER | {"connect", "dropped", "timeout", "http_5xx", "upstream", "model_gone"}
CAPTURE_CHARS = 16000  # an answer's text kept for a shadow pair (pairs.TEXT_CHARS cuts it there)
CALLS_KEPT = 16  # an answer's tool calls kept at most (the first ones)
CALL_CHARS = CAPTURE_CHARS  # their arguments kept at most, all together: a call cut there is marked ``cut``
CALL_NAME_CHARS = 256  # a call's id and function name, each
# Ask backends for plain bodies: the router rewrites them, and passes no Content-Encoding on.
UPSTREAM_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}


MAX_JSON_DEPTH = 64  # deeper request bodies get 400 (no OpenAI request nests past ~10)


def error_body(message: str, type_: str, code: int | str) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "code": code}}


def json_error(status: int, message: str, type_: str, code: int | str | None = None, *,
                headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(message, type_, code if code is not None else status), status=status,
                             headers=headers)


@dataclass
class Attempt:
    backend: str
    stream: bool
    served_model: str | None = None  # what the request was sent as (the backend may be re-pointed or retired since)
    validate: bool = False  # a completion route: check the answer is one
    capture: bool = False  # keep the answer's text (a request mirrored to a shadow)
    started: float = field(default_factory=time.monotonic)
    status: int = 0  # 0 = no answer (connection error or timeout)
    error: str | None = None
    reason: str | None = None  # why it failed, one word: http_5xx, bad_body, no_done, ... (None = it did not)
    responded: bool = False  # a byte went to the client: never replay after this
    completed: bool = False  # the whole answer went through
    client_disconnected: bool = False  # left before the whole answer reached it
    done_sent: bool = False  # a stream's [DONE] went to the client: its answer is complete
    ttfb_s: float | None = None
    latency_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    events: int = 0  # SSE data events relayed: a token count for a stream that ends before its usage
    finish_reason: str | None = None
    upstream_body: bytes = b""  # kept for a failure that is handed to the client as it came
    upstream_content_type: str = "application/json"
    connect_failed: bool = False
    dropped: bool = False  # the backend closed the connection before answering (a stale pooled one, usually)
    response: web.StreamResponse | None = None  # what the client got, once responded
    filtered: bool = False  # the answer filter cut the answer (finish_reason content_filter)
    text_parts: list[str] = field(default_factory=list)
    captured: int = 0  # characters in text_parts: capture stops past CAPTURE_CHARS
    calls: dict[int, CallParts] = field(default_factory=dict)  # the first choice's tool calls, by index
    call_chars: int = 0  # characters of arguments in calls: capture stops past CALL_CHARS

    @property
    def failed_early(self) -> bool:
        """Failed before any byte reached the client, in a way another backend may not: replayable."""
        return not self.responded and not self.client_disconnected and (
            self.status == 0 or self.status >= 500 or self.reason in REPLAYABLE)

    @property
    def ok(self) -> bool:
        """The backend did its part (a client that left early does not count against it)."""
        if self.client_disconnected:
            return self.error is None and (self.status == 0 or 200 <= self.status < 300)
        return self.completed and 200 <= self.status < 300 and self.reason is None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def tool_calls(self) -> list[ToolCall] | None:
        """The first choice's tool calls, assembled (None: there were none)."""
        return [self.calls[i].call() for i in sorted(self.calls)] or None

    def filter_cut(self, text_end: int | None) -> None:
        """The answer filter cut the answer: recorded as content_filter, the captured text cut where the client's
        was (records and pairs never keep what the client did not get)."""
        self.filtered, self.finish_reason = True, "content_filter"
        if text_end is not None and self.text_parts:
            self.text_parts = [self.text[:text_end]]

    def client_left(self) -> None:
        """The client closed its connection. Once a stream's [DONE] has reached it, that is how a stream
        ends (the OpenAI SDK closes right after [DONE]): the answer is complete, not abandoned."""
        if self.done_sent:
            self.completed = True
        else:
            self.client_disconnected = True

    def fail(self, reason: str, error: str) -> None:
        self.reason, self.error = reason, error

    def take_usage(self, event: dict[str, Any]) -> None:
        """Token counts of every usage shape: chat and completions (``prompt_tokens``/``completion_tokens``),
        Responses and Anthropic Messages (``input_tokens``/``output_tokens``), at the top (an answer, a
        usage chunk, Anthropic's ``message_delta``) or in the event's ``response`` (Responses'
        ``response.completed``) or ``message`` (Anthropic's ``message_start``)."""
        for holder in (event, event.get("response"), event.get("message")):
            usage = holder.get("usage") if isinstance(holder, dict) else None
            if not isinstance(usage, dict):
                continue
            for prompt_key, completion_key in USAGE_KEYS:
                prompt, completion = usage.get(prompt_key), usage.get(completion_key)
                if isinstance(prompt, int) and not isinstance(prompt, bool):
                    self.prompt_tokens = prompt
                if isinstance(completion, int) and not isinstance(completion, bool):
                    self.completion_tokens = completion

    def take_event(self, event: Any) -> None:
        """Usage, finish_reason (and the text, when capturing) from an answer or a stream chunk."""
        if not isinstance(event, dict):
            return
        self.take_usage(event)
        for i, choice in enumerate(event.get("choices") or []):
            if not isinstance(choice, dict):
                continue
            reason = choice.get("finish_reason")
            if reason and isinstance(reason, str):
                self.finish_reason = reason
            if self.capture and i == 0:
                piece = choice.get("text")
                part = choice.get("delta") or choice.get("message") or {}
                if piece is None:
                    piece = part.get("content") if isinstance(part, dict) else None
                if isinstance(piece, str) and self.captured < CAPTURE_CHARS:
                    self.text_parts.append(piece)
                    self.captured += len(piece)
                calls = part.get("tool_calls") if isinstance(part, dict) else None
                if isinstance(calls, list):
                    self.take_calls(calls)

    def take_calls(self, calls: list[Any]) -> None:
        """A chat answer's ``message.tool_calls``, or a chunk's ``delta.tool_calls`` (pieces of each call by
        ``index``: name and arguments are concatenated, as the OpenAI SDK assembles them)."""
        for position, raw in enumerate(calls):
            if not isinstance(raw, dict):
                continue
            index = raw.get("index", position)
            if not isinstance(index, int):
                continue
            parts = self.calls.get(index)
            if parts is None:
                if len(self.calls) >= CALLS_KEPT:
                    continue
                parts = self.calls[index] = CallParts()
            fn = raw.get("function")
            fn = fn if isinstance(fn, dict) else {}
            args = fn.get("arguments")
            if args is not None and not isinstance(args, str):  # not OpenAI's string: kept as its JSON
                args = json.dumps(args, ensure_ascii=False)
            self.call_chars += parts.add(raw.get("id"), raw.get("type"), fn.get("name"), args,
                                         CALL_CHARS - self.call_chars)


@dataclass
class CallParts:
    """One tool call as its pieces arrive: the id and type it first names, its name and arguments so far."""

    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    cut: bool = False  # arguments past the capture's budget were dropped

    def add(self, id_: Any, type_: Any, name: Any, args: str | None, budget: int) -> int:
        """Take one piece; the characters of arguments kept (at most ``budget``)."""
        if self.id is None and isinstance(id_, str) and id_:
            self.id = id_[:CALL_NAME_CHARS]
        if isinstance(type_, str) and type_:
            self.type = type_[:CALL_NAME_CHARS]
        if isinstance(name, str):
            self.name = (self.name + name)[:CALL_NAME_CHARS]
        if not args:
            return 0
        kept = args[:max(0, budget)]
        self.cut = self.cut or len(kept) < len(args)
        if kept:
            self.arguments.append(kept)
        return len(kept)

    def call(self) -> ToolCall:
        return ToolCall(id=self.id, type=self.type, function=ToolFunction(name=self.name,
                                                                           arguments="".join(self.arguments)),
                        cut=self.cut or None)


def answer_problem(body: bytes) -> tuple[str, str] | None:
    """(reason, message) when a non-streamed completion's 200 body is not an answer."""
    try:
        data = json.loads(body)
    except ValueError:
        return "bad_body", "answered 200 with a body that is not JSON"
    if not isinstance(data, dict):
        return "bad_body", "answered 200 with JSON that is not an object"
    if "error" in data or data.get("object") == "error":
        return "error_object", "answered 200 with an error object"
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no_choices", "answered 200 without choices"
    return None


class SseRelay:
    """Passes a stream through line by line: notes usage, finish_reason, [DONE] and error
    events, rewrites the model name, drops the usage chunk the client did not ask for."""

    def __init__(self, att: Attempt, rewrite: ModelRewriter, strip_usage: bool,
                 answer_filter: AnswerFilter | None = None) -> None:
        self.att = att
        self.rewrite = rewrite
        self.strip_usage = strip_usage
        self.filter = None if answer_filter is None else StreamFilter(answer_filter, rewrite if rewrite else None)
        self.done = False
        self.error_event = False
        self._tail = b""
        self._skip_blank = False

    def feed(self, chunk: bytes) -> bytes:
        lines = (self._tail + chunk).split(b"\n")
        self._tail = lines.pop()
        out = []
        for line in lines:
            if self._skip_blank:  # the blank line that ended a dropped event
                self._skip_blank = False
                if line in (b"", b"\r"):
                    continue
            out += self._line(line)
        return b"\n".join(out) + b"\n" if out else b""

    @property
    def cut(self) -> bool:
        """The answer filter cut the stream: its content_filter chunk and [DONE] went out; read no more."""
        return self.filter is not None and self.filter.stopped

    def _line(self, line: bytes) -> list[bytes]:
        event: Any = None
        if line.startswith(b"data:"):
            keep, event = self._data_line(line)
            if not keep:
                self._skip_blank = True
                return []
            if self.rewrite:
                line = self.rewrite(line)
        if self.filter is None:
            return [line]
        out = self.filter.line(line, event, done=line.startswith(b"data: [DONE]"))
        if self.filter.stopped:
            self.att.filter_cut(self.filter.cut_at(0))
        return out

    def flush(self) -> bytes:
        tail, self._tail = self._tail, b""
        if self.filter is None:
            return self.rewrite(tail) if self.rewrite else tail
        lines = self._line(tail) if tail else []
        lines += self.filter.end()
        if self.filter.stopped:
            self.att.filter_cut(self.filter.cut_at(0))
        return b"\n".join(lines) + b"\n" if lines else b""

    def _data_line(self, line: bytes) -> tuple[bool, Any]:
        """Note what the line says: (False to drop it, the event when it was parsed)."""
        att = self.att
        if line.startswith(b"data: [DONE]"):
            self.done = True
            return True, None
        att.events += 1
        if line.startswith((b'data: {"error"', b'data:{"error"', b'data: {"object":"error"')):
            self.error_event = True
        event: Any = None
        if self.filter is not None or att.capture or b'"usage":{' in line or b'"usage": {' in line or (
            b'"finish_reason":' in line and b'"finish_reason":null' not in line
            and b'"finish_reason": null' not in line
        ):
            with contextlib.suppress(ValueError):
                event = json.loads(line[5:])
                att.take_event(event)
        return not (self.strip_usage and is_usage_only(line)), event


def response_headers(request_id: str, backend: Backend | None, content_type: str | None = None) -> dict[str, str]:
    """An answer's headers: X-Request-Id, and X-Qlift-Backend when ``backend`` is given (an operator's call)."""
    headers = {"X-Request-Id": request_id}
    if content_type is not None:
        headers["Content-Type"] = content_type
    if backend is not None:
        headers["X-Qlift-Backend"] = backend.name
    return headers


@dataclass(frozen=True)
class Upstream:
    """Where one attempt goes, what it sends, and how long it may take."""

    backend: Backend
    payload: bytes
    request_id: str
    first_byte_s: float  # the wait for a non-streamed answer, or a stream's first event
    idle_s: float  # the longest silence inside a stream
    deadline: float  # time.monotonic() that ends the request wherever it is
    rewrite: ModelRewriter
    strip_usage: bool = False  # drop the usage-only chunk the router asked for and the client did not
    show_backend: bool = False  # send X-Qlift-Backend (the admin token's caller, or expose_backend_header)
    answer_filter: AnswerFilter | None = None  # check the answer's text (completion routes, filter on)


async def attempt(request: web.Request, session: aiohttp.ClientSession, up: Upstream, att: Attempt) -> None:
    """Run one attempt, filling ``att``. Answers the client unless it failed early (see Attempt.failed_early)."""
    backend, request_id, first_byte_s, deadline = up.backend, up.request_id, up.first_byte_s, up.deadline
    stream = att.stream
    headers = {**UPSTREAM_HEADERS, "X-Request-Id": request_id}
    upstream: aiohttp.ClientResponse | None = None
    first_chunk = b""
    wait = max(0.0, min(first_byte_s, deadline - time.monotonic()))
    try:
        try:
            async with asyncio.timeout(wait):
                upstream = await session.post(backend.url + request.path, data=up.payload, headers=headers)
                att.status = upstream.status
                content_type = upstream.headers.get("Content-Type", "application/json")
                sse = content_type.startswith("text/event-stream")
                if upstream.status != 200 or not stream or not sse:
                    body = await upstream.read()
                    att.ttfb_s = time.monotonic() - att.started  # the whole answer comes at once
                else:
                    first_chunk = await upstream.content.readany()
                    att.ttfb_s = time.monotonic() - att.started  # a stream's first event: its first token
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
            att.connect_failed = isinstance(exc, aiohttp.ClientConnectorError)
            att.dropped = isinstance(exc, aiohttp.ServerDisconnectedError)
            att.status = 0
            att.fail("connect" if att.connect_failed else "dropped", f"connection failed: {type(exc).__name__}")
            return
        except TimeoutError:
            att.status = 0
            if time.monotonic() >= deadline:
                att.fail("deadline", "request deadline (timeouts.request_s) reached before an answer")
            else:
                att.fail("timeout", f"no answer within {first_byte_s:g} s")
            return
        except aiohttp.ClientError as exc:
            att.status = 0
            att.fail("upstream", redact_url(f"{type(exc).__name__}: {exc}"))
            return
        if upstream.status != 200 or not stream or not sse:
            await _answer_whole(request, up, content_type, body, att, expect_stream=stream)
            return
        if not first_chunk:  # a 200 stream that ended before its first event: nothing was sent, replay
            att.fail("no_done", "stream ended before its first event")
            return
        await _relay_stream(request, upstream, up, content_type, first_chunk, att,
                            SseRelay(att, up.rewrite, up.strip_usage, up.answer_filter))
    except asyncio.CancelledError:
        att.client_left()
        raise
    finally:
        att.latency_s = time.monotonic() - att.started
        if upstream is not None:
            if att.completed and not att.filtered:
                upstream.release()
            else:  # drop the connection: vLLM sees the disconnect and aborts the request
                upstream.close()


async def _answer_whole(request: web.Request, up: Upstream, content_type: str, body: bytes, att: Attempt, *,
                        expect_stream: bool) -> None:
    backend, rewrite = up.backend, up.rewrite
    status = att.status
    if status >= 500:
        att.fail("http_5xx", f"HTTP {status}")
        att.upstream_body, att.upstream_content_type = body, content_type
        return
    if status == 404 and backend.served_model and f"`{backend.served_model}`".encode() in body:
        # vLLM's "The model `NAME` does not exist.": the backend stopped serving its own model (an adapter
        # unloaded, a restart with other flags). Its failure, not the client's; replayed, never shown.
        att.fail("model_gone", "the backend no longer serves its model")
        att.upstream_body, att.upstream_content_type = b"", content_type
        return
    if status == 200 and att.validate:
        problem = ("bad_body", "answered a stream request with a body that is not an event stream") \
            if expect_stream else answer_problem(body)
        if problem is not None:
            att.fail(problem[0], f"backend {problem[1]}")
            att.upstream_body, att.upstream_content_type = body, content_type
            return
    if status == 200:
        if content_type.startswith("application/json"):
            with contextlib.suppress(ValueError):
                answer = json.loads(body)
                cut = up.answer_filter is not None and isinstance(answer, dict) and filter_whole(up.answer_filter,
                                                                                                  answer)
                att.take_event(answer)  # after the filter: records keep what the client gets, calls included
                if cut:
                    body = compact_json(answer)
                    att.filter_cut(None)
    else:
        att.fail(f"http_{status // 100}xx", f"HTTP {status}")
    if rewrite and content_type.startswith("application/json"):
        body = rewrite(body)
    att.responded = True
    headers = response_headers(up.request_id, backend if up.show_backend else None, content_type)
    att.response = web.Response(body=body, status=status, headers=headers)
    await att.response.prepare(request)
    await att.response.write_eof()
    att.completed = True


async def _relay_stream(request: web.Request, upstream: aiohttp.ClientResponse, up: Upstream, content_type: str,
                        first_chunk: bytes, att: Attempt, relay: SseRelay) -> None:
    backend, idle_s, deadline = up.backend, up.idle_s, up.deadline
    headers = response_headers(up.request_id, backend if up.show_backend else None, content_type)
    out = web.StreamResponse(status=200, headers={**headers, "Cache-Control": "no-cache"})
    att.response = out
    try:
        await out.prepare(request)
        att.responded = True
        chunk = first_chunk
        while True:
            data = relay.feed(chunk)
            if data:
                await out.write(data)
                att.done_sent = relay.done or relay.cut
            if relay.cut:  # the answer filter ended the client's stream: the backend's rest is dropped
                break
            try:
                async with asyncio.timeout(max(0.0, min(idle_s, deadline - time.monotonic()))):
                    chunk = await upstream.content.readany()
            except (TimeoutError, aiohttp.ClientError) as exc:
                if isinstance(exc, TimeoutError) and time.monotonic() >= deadline:
                    att.fail("deadline", "request deadline (timeouts.request_s) reached mid-stream")
                elif isinstance(exc, TimeoutError):
                    att.fail("idle_timeout", f"stream from backend silent for {idle_s:g} s")
                else:
                    att.fail("stream_broke", f"stream from backend broke: {type(exc).__name__}")
                message = f"backend {backend.name}: {att.error}"
                event = json.dumps(error_body(message, "upstream_error", 502))
                tail = relay.flush()
                await out.write(tail if relay.cut else tail + f"data: {event}\n\n".encode())
                break
            if not chunk:
                tail = relay.flush()
                if tail:
                    await out.write(tail)
                att.done_sent = att.done_sent or relay.cut
                if relay.error_event:
                    att.fail("error_event", "stream carried an error event")
                elif not relay.done and not relay.cut and att.validate:
                    att.fail("no_done", "stream from backend ended without [DONE]")
                break
        await out.write_eof()
        att.completed = att.reason is None or att.reason == "error_event"
    except ConnectionResetError:  # the client went away between two chunks
        att.client_left()
