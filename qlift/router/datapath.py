"""The router's data path: a client's OpenAI request from its arrival to its answer.

Admission (API key, body, model name, content filter, rate and token limits), the choice of
backend, the proxied attempt and its one replay, the shadow copy beside it, and what each
attempt leaves behind (metrics, the request records the admin API serves, the access log).
The server around it (lifecycle, plain routes) is ``app.Router``; the admin API is ``admin.AdminApi``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from aiohttp import web

from qlift.router.accesslog import AccessLog
from qlift.router.answerfilter import AnswerFilter, cut_before_hit
from qlift.router.answers import AnswerSamples
from qlift.router.balancer import Backend
from qlift.router.filters import ContentFilter, WordListFilter, prompt_text
from qlift.router.limits import KeyLimits, bearer_token, max_output_tokens, tokens_used
from qlift.router.metrics import status_class, token_latency
from qlift.router.pairs import Pair, PairRing, answer_record, judge_view
from qlift.router.proxy import BAD_ANSWER, MAX_JSON_DEPTH, Attempt, Upstream, attempt, json_error, response_headers
from qlift.router.rewrite import ModelRewriter
from qlift.router.shadow import send_copy
from qlift.router.textnorm import estimate_tokens, has_token_ids, json_depth
from qlift.router.wire import RequestRecord

if TYPE_CHECKING:
    from qlift.router.app import Router

log = logging.getLogger("qlift.router.app")  # one logger for the server's lines, as before the split

RECORDS_KEPT = 20000
COMPLETIONS = ("/v1/chat/completions", "/v1/completions")  # checked answers, usage, shadow copies
# Every other OpenAI-compatible or vLLM route that takes a JSON body naming the model: proxied
# with the model name rewritten (a backend that does not serve one answers its own 404).
PASSTHROUGH = ("/v1/responses", "/v1/embeddings", "/v1/score", "/score", "/v1/rerank", "/rerank", "/v2/rerank",
               "/v2/embed", "/tokenize", "/detokenize", "/pooling", "/classify", "/v1/messages",
               "/v1/messages/count_tokens")
GENERATES = (*COMPLETIONS, "/v1/responses", "/v1/messages")  # routes whose answers are generated tokens
BIG_PROMPT_CHARS = 1 << 16  # the filter checks texts longer than this in a worker thread


def _parse_body(raw: bytes) -> tuple[dict[str, Any], str | None]:
    """The request's JSON object, or why the body is not one the router can take."""
    try:
        body = json.loads(raw)
    except RecursionError:
        return {}, f"request body nests deeper than {MAX_JSON_DEPTH} levels"
    except ValueError:
        return {}, "request body is not a JSON object"
    if not isinstance(body, dict):
        return {}, "request body is not a JSON object"
    if json_depth(body, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        return {}, f"request body nests deeper than {MAX_JSON_DEPTH} levels"
    return body, None


class DataPath:
    """Answers the OpenAI routes for ``router``, whose backends, sessions, health and metrics it shares.

    It owns what only the data path writes: the limits and filter it applies, the requests in flight
    (the drain waits for them), the shadow copies under way, the request records and answer pairs
    the admin API reads, and the access log. The public model, the shadow settings and the health
    checker are read from the router on every request (they change after start and through the admin API).
    """

    def __init__(self, router: Router, content_filter: ContentFilter | None = None) -> None:
        self.router = router
        config = self.config = router.config
        self.balancer, self.metrics = router.balancer, router.metrics
        self.sessions, self.keys = router.sessions, router.keys
        lim = config.limits
        self.limits = KeyLimits(lim.requests_per_s, lim.burst, lim.tokens_per_min)
        reload_failed = self.metrics.filter_reload_failures.inc
        self.content_filter = content_filter or (
            WordListFilter(config.filter_file, on_reload_failed=reload_failed) if config.filter_file else None)
        self.access_log = AccessLog(config.access_log)
        self.records: deque[dict[str, Any]] = deque(maxlen=RECORDS_KEPT)
        self.answers = AnswerSamples(config.answer_sample)
        self.seq = 0
        self.pair_ring = PairRing()
        self.shadow_tasks: set[asyncio.Task[None]] = set()
        self.active = 0  # client requests being answered (the drain waits for 0)
        self.idle = asyncio.Event()
        self.idle.set()

    # -- admission ----------------------------------------------------------------------

    def _reject(self, status: int, reason: str | None, key: str, message: str, type_: str, *,
                request_id: str, t0: float, path: str, headers: dict[str, str] | None = None,
                code: int | str | None = None) -> web.Response:
        if reason is not None:
            self.metrics.rejected.labels(key, reason).inc()
        self.access_log.write(request_id=request_id, key_id=key, path=path, model=self.router.public_model,
                              backend=None, stream=None, status=status, prompt_tokens=None, completion_tokens=None,
                              finish_reason=None, ttfb_s=None, latency_s=round(time.monotonic() - t0, 6),
                              retried_from=None, error=reason or type_)
        return json_error(status, message, type_, code, headers={**(headers or {}), "X-Request-Id": request_id})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """One client request on a route of COMPLETIONS or PASSTHROUGH."""
        t0 = time.monotonic()
        rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        path = request.path
        key = self.keys.identify(bearer_token(request.headers.get("Authorization")))
        request["show_backend"] = self.config.expose_backend_header or self.router.is_admin(request)
        reject = functools.partial(self._reject, request_id=rid, t0=t0, path=path)
        if key is None:
            return reject(401, "auth", "unknown", "missing or unknown API key", "invalid_request_error",
                                code="invalid_api_key")
        try:
            async with asyncio.timeout(self.config.server.body_timeout_s):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return reject(413, "too_large", key, f"request body over {self.config.max_request_bytes} bytes",
                                "invalid_request_error")
        except TimeoutError:
            self.metrics.client_timeouts.labels("body").inc()
            return reject(408, "body_timeout", key, f"request body not received within "
                          f"{self.config.server.body_timeout_s:g} s", "invalid_request_error",
                          headers={"Connection": "close"})
        body, problem = _parse_body(raw)
        if problem is not None:
            return reject(400, "bad_body", key, problem, "invalid_request_error")
        if self.router.public_model is None:
            first = self.balancer.backends[0]
            return reject(503, None, key, f"the public model name is not known yet: backend {first.name!r} has not "
                          "listed its model at /v1/models; retry, or start the router with --public-model",
                          "service_unavailable", headers={"Retry-After": "5"})
        model = body.get("model", self.router.public_model)
        if model != self.router.public_model:
            return reject(404, None, key, f"model {model!r} does not exist; this router serves "
                                f"{self.router.public_model!r}", "invalid_request_error", code="model_not_found")
        if self.content_filter is not None:
            if has_token_ids(body):
                return reject(400, "filter", key, "prompts given as token ids or embeddings are refused while the "
                              "content filter is on: send the prompt as text", "invalid_request_error",
                              code="content_filter")
            text = prompt_text(body)
            check = self.content_filter.check
            hit = await asyncio.to_thread(check, text) if len(text) > BIG_PROMPT_CHARS else check(text)
            if hit is not None:
                return reject(400, "filter", key, f"prompt blocked by content filter rule {hit.rule}",
                                    "invalid_request_error", code="content_filter")
        refusal = self.limits.admit(key)
        if refusal is not None:
            retry = str(max(1, math.ceil(refusal.retry_after_s)))
            return reject(429, refusal.reason, key, refusal.message, "rate_limit_exceeded",
                                headers={"Retry-After": retry})
        if self.limits.tokens_per_min:  # the prompt is charged now: a client that leaves early still pays
            request["prompt_estimate"] = estimate_tokens(body)
            request["max_output"] = max_output_tokens(body, path in GENERATES)
            self.limits.charge_tokens(key, request["prompt_estimate"])
        stream = bool(body.get("stream"))
        client_body, strip_usage = body, False
        if stream and path in COMPLETIONS:  # ask for usage so logs and token limits see the stream's counts
            options = body.get("stream_options")
            options = options if isinstance(options, dict) else {}
            if not options.get("include_usage"):  # ... and keep the chunk it adds from a client that did not ask
                body, strip_usage = {**body, "stream_options": {**options, "include_usage": True}}, True
        session_key = request.headers.get("X-Session-Id") or (body["user"] if isinstance(body.get("user"), str)
                                                               else None)
        self.active += 1
        self.idle.clear()
        try:
            return await self._route(request, body, rid=rid, key=key, stream=stream, session_key=session_key, t0=t0,
                                     client_body=client_body, strip_usage=strip_usage)
        finally:
            self.active -= 1
            if self.active == 0:
                self.idle.set()
            if "prompt_estimate" in request and not request.get("tokens_settled"):
                self.limits.charge_tokens(key, -request["prompt_estimate"])  # no backend was asked: refunded

    # -- proxying -----------------------------------------------------------------------

    async def _route(self, request: web.Request, body: dict[str, Any], *, rid: str, key: str, stream: bool,
                     session_key: str | None, t0: float, client_body: dict[str, Any],
                     strip_usage: bool) -> web.StreamResponse:
        backend = self.balancer.choose(session_key)
        if backend is None:
            return self._reject(503, None, key, "no healthy backend", "service_unavailable", request_id=rid,
                                t0=t0, path=request.path)
        t = self.config.timeouts
        first_byte_s = t.first_byte_for(stream)
        deadline = t0 + t.request_s
        validate = request.path in COMPLETIONS
        answer_filter = self._answer_filter() if validate else None
        pair = self._mirror(request.path, client_body, backend, rid) if validate else None
        sampled = validate and self.answers.wanted()
        retried_from: str | None = None
        resent = False
        att = Attempt(backend.name, stream, backend.served_model)
        try:
            while True:
                att = Attempt(backend.name, stream, backend.served_model, validate=validate,
                              capture=pair is not None or sampled)
                payload = json.dumps({**body, "model": att.served_model}).encode()
                public = self.router.public_model if self.config.rewrite_model else None
                rewrite = ModelRewriter(att.served_model, public)
                self._begin(backend)
                try:
                    up = Upstream(backend, payload, rid, first_byte_s, t.idle_s, deadline, rewrite, strip_usage,
                                  show_backend=request["show_backend"], answer_filter=answer_filter)
                    await attempt(request, self.sessions[backend.name], up, att)
                finally:
                    self._end(backend)
                if att.connect_failed and self.router.health is not None:
                    self.router.health.mark_down(backend)
                if att.reason == "model_gone" and self.router.health is not None:
                    self.router.health.model_gone(backend)
                if att.dropped and not resent:
                    # Not the backend's fault until it happens twice: a pooled connection it had
                    # already closed. Resend once on the same backend; a dead one then fails to connect.
                    resent = True
                    log.info("request %s: %s dropped the connection before answering, resending", rid, backend.name)
                    continue
                replay_on = None
                if att.failed_early and retried_from is None and time.monotonic() < deadline:
                    replay_on = self.balancer.choose(session_key, exclude={backend.name})
                record = self._finish(att, backend, rid, replayed=replay_on is not None,
                                      session=session_key is not None)
                if sampled and att.ok:
                    self.answers.attach(record, client_body, att.text, att.tool_calls)
                if replay_on is None:
                    break
                log.info("request %s: %s failed (%s), replaying on %s", rid, backend.name, att.error, replay_on.name)
                retried_from, backend = backend.name, replay_on
        except asyncio.CancelledError:  # the client went away: the attempt closed its upstream
            att.client_left()  # after a stream's [DONE]: complete, and logged as the 200 it was
            self._finish(att, backend, rid, replayed=False, session=session_key is not None)
            self._log(att, rid, key, request.path, status=499 if att.client_disconnected else att.status, t0=t0,
                      retried_from=retried_from)
            self._pair_primary(pair, att)
            self._charge(request, key, att)
            raise
        self._pair_primary(pair, att)
        if att.failed_early:  # nowhere left to replay: hand the failure over
            status, response = self._failure_response(att, rid, backend, show_backend=request["show_backend"])
        else:
            status, response = att.status, None
        self._log(att, rid, key, request.path, status=status, t0=t0, retried_from=retried_from)
        self._charge(request, key, att)
        if response is not None:
            return response
        assert att.response is not None  # attempt() answered the client
        return att.response

    def _filter_copy(self, att: Attempt) -> None:
        """A shadow copy's answer reaches no client, but is judged as one would be: cut where the client's
        answer would have been, so the judge counts the canary's filtered answers before users see any."""
        flt = self._answer_filter()
        if flt is None or not att.ok or not att.text or flt.check(att.text) is None:
            return
        att.filter_cut(cut_before_hit(flt.check, att.text, final=True))

    def _answer_filter(self) -> AnswerFilter | None:
        """The content filter as answers are checked with it (its rules as they are now), when answers are filtered."""
        if self.content_filter is None or not self.config.filter_answers:
            return None
        return AnswerFilter.of(self.content_filter)

    def _charge(self, request: web.Request, key: str, att: Attempt) -> None:
        """Settle the tokens/min limit: usage (or what was streamed) less the prompt estimate charged up front."""
        estimate = request.get("prompt_estimate", 0)
        used = tokens_used(estimate, att.prompt_tokens, att.completion_tokens, att.events,
                           completed=att.completed and not att.client_disconnected,
                           max_output=request.get("max_output"))
        self.limits.charge_tokens(key, used - estimate)
        request["tokens_settled"] = True

    def _failure_response(self, att: Attempt, rid: str, backend: Backend, *, show_backend: bool
                          ) -> tuple[int, web.Response]:
        headers = response_headers(rid, backend if show_backend else None)
        if att.status >= 500:
            return att.status, web.Response(body=att.upstream_body, status=att.status,
                                            content_type=att.upstream_content_type.split(";")[0], headers=headers)
        status = 504 if att.reason in ("timeout", "deadline") else 502
        return status, json_error(status, f"backend {backend.name} failed: {att.error}", "upstream_error",
                                   headers=headers)

    # -- shadow copies ------------------------------------------------------------------

    def _mirror(self, path: str, client_body: dict[str, Any], primary: Backend, rid: str) -> Pair | None:
        """Start this request's shadow copy if it is its turn and there is room; never waits on it."""
        shadow = self.router.shadow
        if shadow is None or not shadow.wants(primary):
            return None
        target = self.balancer.by_name[shadow.settings.target_for(primary.name) or shadow.settings.version]
        if not shadow.admit(target):
            self.metrics.shadow.labels(target.name, "dropped").inc()
            return None
        pair = Pair(rid=rid, ts=time.time(), path=path, request=judge_view(client_body))

        async def run() -> None:
            if not await shadow.acquire():
                self.metrics.shadow.labels(target.name, "dropped").inc()
                return
            try:
                att = await send_copy(self.sessions[target.name], target, path, client_body, request_id=rid,
                                      timeouts=self.config.timeouts)
            except Exception as exc:  # a copy never takes the router down, and its pair is still filed
                log.exception("request %s: shadow copy to %s failed", rid, target.name)
                att = Attempt(target.name, bool(client_body.get("stream")), target.served_model)
                att.fail("internal", f"{type(exc).__name__}")
            finally:
                await shadow.release()
            self.metrics.shadow.labels(target.name, "ok" if att.ok else "failed").inc()
            self._filter_copy(att)
            pair.shadow = answer_record(att)
            self.pair_ring.finish(pair)

        task = asyncio.get_running_loop().create_task(run())
        self.shadow_tasks.add(task)
        task.add_done_callback(self.shadow_tasks.discard)
        return pair

    def _pair_primary(self, pair: Pair | None, att: Attempt) -> None:
        if pair is not None:
            pair.primary = answer_record(att)
            self.pair_ring.finish(pair)

    def _begin(self, backend: Backend) -> None:
        backend.in_flight += 1
        backend.requests += 1
        self.metrics.in_flight.labels(backend.name).inc()

    def _end(self, backend: Backend) -> None:
        backend.in_flight -= 1
        self.metrics.in_flight.labels(backend.name).dec()

    def _finish(self, att: Attempt, backend: Backend, rid: str, *, replayed: bool, session: bool = False
                ) -> dict[str, Any]:
        """Count one attempt: metrics, backend counters, the admin API's record (``session``: the request carried
        a session key, so the balancer kept it on that key's version: promote's traffic reason reads it)."""
        m, name = self.metrics, backend.name
        ok = att.ok
        if not ok and not att.client_disconnected:
            backend.errors += 1
        broken = (att.responded and not att.completed and not att.client_disconnected) or att.reason in BAD_ANSWER
        m.requests.labels(name, status_class(att.status, broken)).inc()
        if att.reason is not None and not att.client_disconnected:
            m.failures.labels(name, att.reason).inc()
        stream = "true" if att.stream else "false"
        m.duration.labels(name, stream).observe(att.latency_s)
        if att.ttfb_s is not None:
            m.ttfb.labels(name, stream).observe(att.ttfb_s)
        per_token = token_latency(att.latency_s, att.ttfb_s, att.completion_tokens, att.stream) if ok else None
        if per_token is not None:
            m.token_latency.labels(name, stream).observe(per_token)
        if att.completion_tokens:
            m.completion_tokens.labels(name).inc(att.completion_tokens)
        elif ok and att.completed and att.completion_tokens == 0:
            m.empty_completions.labels(name).inc()
        if att.finish_reason:
            m.finish_reason.labels(name, att.finish_reason).inc()
        if att.filtered:
            m.answers_filtered.labels(name).inc()
        if replayed:
            m.retries.labels(name).inc()
        self.seq += 1
        record = RequestRecord(
            seq=self.seq, time=time.time(), request_id=rid, backend=name, status=att.status, ok=ok,
            replayed=replayed, stream=att.stream, latency_s=round(att.latency_s, 6),
            ttfb_s=None if att.ttfb_s is None else round(att.ttfb_s, 6), prompt_tokens=att.prompt_tokens,
            completion_tokens=att.completion_tokens, finish_reason=att.finish_reason,
            client_disconnected=att.client_disconnected, reason=att.reason, session=session)
        # Kept as the dict the admin API sends: a sampled record's answer comes and goes (AnswerSamples).
        self.records.append(record.model_dump(exclude={"answer"}))
        return self.records[-1]

    def _log(self, att: Attempt, rid: str, key: str, path: str, *, status: int, t0: float,
             retried_from: str | None) -> None:
        # ttfb as the client saw it: from arrival here to the first byte of the final attempt.
        ttfb = None if att.ttfb_s is None else att.started - t0 + att.ttfb_s
        self.access_log.write(
            request_id=rid, key_id=key, path=path, model=self.router.public_model, backend=att.backend,
            served_model=att.served_model, stream=att.stream, status=status, prompt_tokens=att.prompt_tokens,
            completion_tokens=att.completion_tokens, finish_reason=att.finish_reason,
            ttfb_s=None if ttfb is None else round(ttfb, 6), latency_s=round(time.monotonic() - t0, 6),
            retried_from=retried_from, client_disconnected=att.client_disconnected, error=att.error,
            reason=att.reason,
        )

