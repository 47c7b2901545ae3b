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


class RouterState(BaseModel):
    public_model: str
    weights: dict[str, int]
    backends: list[BackendState]
    started_at: str
    seq: int

    def backend(self, name: str) -> BackendState:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)


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


class RequestBatch(BaseModel):
    seq: int
    requests: list[RequestRecord]


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
