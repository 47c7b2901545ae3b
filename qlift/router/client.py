"""Typed client for the router's admin API (what `qlift promote` drives).

The admin API lives on the router's own port and answers only with
``Authorization: Bearer $QLIFT_ROUTER_TOKEN``.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel

from qlift.errors import BadInputError, ExternalToolError


class BackendState(BaseModel):
    name: str
    url: str
    served_model: str
    weight: int
    healthy: bool
    in_flight: int
    requests: int
    errors: int
    problem: str | None = None  # why it is out of rotation beyond a failing /health (its model not listed)
    model_hash: str | None = None  # the version's ModelRef content hash (the router config's model_hash)
    identity: str | None = None  # model_hash, else the root its server lists: what a rollout checks each window


class ShadowState(BaseModel):
    """The shadow in force: its settings and what it did since it was set."""

    version: str
    percent: float
    max_inflight: int
    sent: int
    dropped: int
    inflight: int = 0
    waiting: int = 0
    partner: str | None = None  # requests either serves are copied to the other (a split window's pairs)


class RouterState(BaseModel):
    public_model: str | None  # None until the first backend has named its model (no --public-model)
    weights: dict[str, int]
    backends: list[BackendState]
    started_at: str
    seq: int
    shadow: ShadowState | None = None

    def backend(self, name: str) -> BackendState:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)


class AnswerRecord(BaseModel):
    """A sampled answer (the router's ``answer_sample``): the user's message, the answer, the system prompt
    (every system message's text; None without one) and the request's response_format (any type)."""

    prompt: str
    text: str
    system: str | None = None
    response_format: dict[str, Any] | None = None

    def request(self) -> dict[str, Any]:
        """The request as the answer checks read it: ``prompt``, and ``system`` and ``response_format`` when set."""
        out: dict[str, Any] = {"prompt": self.prompt}
        if self.system is not None:
            out["system"] = self.system
        if self.response_format is not None:
            out["response_format"] = self.response_format
        return out


class RequestRecord(BaseModel):
    """One upstream attempt. ``status`` 0 means a connection error or timeout."""

    seq: int
    time: float
    request_id: str
    backend: str
    status: int
    ok: bool
    replayed: bool
    stream: bool
    latency_s: float
    ttfb_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    client_disconnected: bool = False
    reason: str | None = None  # why it failed: http_5xx, connect, timeout, bad_body, no_choices, no_done, ...
    answer: AnswerRecord | None = None
    session: bool = False  # it carried a session key (X-Session-Id or user): sticky to that key's version


class RequestBatch(BaseModel):
    seq: int
    requests: list[RequestRecord]


class ShadowAnswer(BaseModel):
    """One side of a shadow pair. ``ttft_s``: a stream's first event, or the whole non-streamed answer."""

    backend: str
    status: int
    ok: bool
    reason: str | None = None
    latency_s: float
    ttft_s: float | None = None
    text: str
    finish_reason: str | None = None
    completion_tokens: int | None = None


class ShadowPair(BaseModel):
    """The same request answered by the version users saw (primary) and by the shadow."""

    seq: int
    rid: str
    ts: float
    path: str
    request: dict[str, Any]
    primary: ShadowAnswer
    shadow: ShadowAnswer


class ShadowBatch(BaseModel):
    next: int  # pass as since= next time
    pairs: list[ShadowPair]


class RouterClient:
    """Synchronous admin client: ``RouterClient(url, token).state()``."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def state(self) -> RouterState:
        return RouterState.model_validate(self._call("GET", "/admin/state"))

    def set_weights(self, weights: dict[str, int]) -> RouterState:
        return RouterState.model_validate(self._call("PUT", "/admin/weights", json=weights))

    def requests(self, since: int = 0) -> RequestBatch:
        return RequestBatch.model_validate(self._call("GET", "/admin/requests", params={"since": since}))

    def set_shadow(self, version: str, percent: float, max_inflight: int = 4) -> RouterState:
        """Mirror ``percent`` of the requests other versions serve to ``version`` (answers never reach users)."""
        body = {"version": version, "percent": percent, "max_inflight": max_inflight}
        return RouterState.model_validate(self._call("PUT", "/admin/shadow", json=body))

    def clear_shadow(self) -> RouterState:
        return RouterState.model_validate(self._call("DELETE", "/admin/shadow"))

    def shadow_pairs(self, since: int = 0) -> ShadowBatch:
        return ShadowBatch.model_validate(self._call("GET", "/admin/shadow", params={"since": since}))

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            resp = httpx.request(method, self.url + path, headers=headers, timeout=self.timeout, **kwargs)
        except httpx.HTTPError as exc:
            raise ExternalToolError(
                f"router at {self.url} did not answer {method} {path}: {type(exc).__name__}: {exc}",
                hint="Check that `qlift router` is running and the URL is right.",
                tool="router",
            ) from exc
        if resp.status_code == 401:
            raise BadInputError(
                f"router at {self.url} refused the admin token: {_error_message(resp)}",
                hint="Set QLIFT_ROUTER_TOKEN to the token the router was started with "
                "(the router's admin API is off when it was started without QLIFT_ROUTER_TOKEN).",
            )
        if resp.status_code == 400:
            raise BadInputError(f"router refused {method} {path}: {_error_message(resp)}")
        if resp.status_code != 200:
            raise ExternalToolError(
                f"router {method} {path} answered HTTP {resp.status_code}: {_error_message(resp)}", tool="router"
            )
        return resp.json()


def _error_message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]
