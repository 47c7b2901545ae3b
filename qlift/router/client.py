"""Typed client for the router's admin API (what `qlift promote` drives).

The admin API lives on the router's own port and answers only with
``Authorization: Bearer $QLIFT_ROUTER_TOKEN``.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from qlift import httpclient
from qlift.errors import BadInputError, ExternalToolError, IncompatibleError, NotFoundError, QliftError
from qlift.router.backend_change import BackendChange
from qlift.router.wire import (
    AnswerRecord,
    BackendState,
    RequestBatch,
    RequestRecord,
    RouterState,
    ShadowAnswer,
    ShadowBatch,
    ShadowPair,
    ShadowSettings,
    ShadowState,
)

# The wire types are qlift.router.wire's; their old home keeps the names its callers import.
__all__ = ["AnswerRecord", "BackendChange", "BackendState", "RequestBatch", "RequestRecord", "RouterClient",
           "RouterState", "ShadowAnswer", "ShadowBatch", "ShadowPair", "ShadowState"]

Wire = TypeVar("Wire", bound=BaseModel)

# On the 503 a router answers an admin write with while a new process takes it over (`qlift router --take-over`).
HANDOVER_HEADER = "X-Qlift-Handover"
HANDOVER_RETRY_S = 30.0  # how long a call retries such 503s: a new router's start, its first health round included

# A live-backend call the router refused, by status: the router's one line is the message. A 404 without the
# router's own error body is a router without /admin/backends (an older qlift): ExternalToolError.
BACKEND_REFUSALS: dict[int, tuple[str, type[QliftError]]] = {
    404: ("not_found_error", NotFoundError),
    409: ("conflict_error", IncompatibleError),
}


class RouterClient:
    """Synchronous admin client: ``RouterClient(url, token).state()``."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def state(self) -> RouterState:
        return self._answer(RouterState, "GET", "/admin/state")

    def set_weights(self, weights: dict[str, int]) -> RouterState:
        return self._answer(RouterState, "PUT", "/admin/weights", json=weights)

    def requests(self, since: int = 0) -> RequestBatch:
        return self._answer(RequestBatch, "GET", "/admin/requests", params={"since": since})

    def set_shadow(self, version: str, percent: float, max_inflight: int = 4, *, partner: str | None = None
                   ) -> RouterState:
        """Mirror ``percent`` of the requests other versions serve to ``version`` (answers never reach users);
        with ``partner``, of the requests either of the two serves to the other."""
        body = ShadowSettings(version, percent, max_inflight, partner).as_dict()
        return self._answer(RouterState, "PUT", "/admin/shadow", json=body)

    def clear_shadow(self) -> RouterState:
        """Stop mirroring; copies in flight finish and their pairs stay readable."""
        return self._answer(RouterState, "DELETE", "/admin/shadow")

    def shadow_pairs(self, since: int = 0) -> ShadowBatch:
        """The pairs filed after pair ``since`` (all kept ones for a ``since`` from before a restart)."""
        return self._answer(ShadowBatch, "GET", "/admin/shadow", params={"since": since})

    # -- live backends (docs/router.md "Live backends") ----------------------------------

    def add_backend(self, name: str, url: str, model: str | None = None, *, model_hash: str | None = None
                    ) -> BackendChange:
        """A new backend at weight 0 (``url`` may end in ``#MODEL``; a ``model`` pins it, else it takes the
        model its server lists). NotFoundError/IncompatibleError name what the router refused."""
        body = {"name": name, "url": url} | _set(model=model, model_hash=model_hash)
        return self._answer(BackendChange, "POST", "/admin/backends", json=body, refusals=BACKEND_REFUSALS)

    def repoint_backend(self, name: str, url: str | None = None, model: str | None = None, *,
                        unpin: bool = False, model_hash: str | None = None) -> BackendChange:
        """Point a backend at another server and/or model: ``model`` pins it to that name; ``unpin`` lets it take
        whatever its server lists (and follow a change of model)."""
        body: dict[str, Any] = _set(url=url, model=model, model_hash=model_hash) | ({"model": None} if unpin else {})
        return self._answer(BackendChange, "PUT", f"/admin/backends/{name}", json=body, refusals=BACKEND_REFUSALS)

    def retire_backend(self, name: str) -> BackendChange:
        """Remove a backend; refused (IncompatibleError) while it has weight or the shadow names it."""
        return self._answer(BackendChange, "DELETE", f"/admin/backends/{name}", refusals=BACKEND_REFUSALS)

    def resolve_backend(self, name: str, *, pin: bool = False) -> BackendChange:
        """Re-read the backend's /v1/models and take the model listed (a pinned one only with ``pin``, which
        pins it to that model); ExternalToolError when its server does not answer."""
        return self._answer(BackendChange, "POST", f"/admin/backends/{name}/resolve", json={"pin": pin},
                            refusals=BACKEND_REFUSALS)

    def _answer(self, model: type[Wire], method: str, path: str, **kwargs: Any) -> Wire:
        """The admin call's answer as the wire type it is; one that does not fit is the router's fault."""
        data = self._call(method, path, **kwargs)
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise ExternalToolError(f"router at {self.url} answered {path} with a body that is not a "
                                    f"{model.__name__}: {where}: {first['msg']}",
                                    hint="Run a qlift router of this qlift's version.", tool="router") from exc

    def _call(self, method: str, path: str, *, refusals: dict[int, tuple[str, type[QliftError]]] | None = None,
              **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            resp = _request_past_handover(method, self.url + path, headers=headers, timeout=self.timeout, **kwargs)
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
        refused = (refusals or {}).get(resp.status_code)
        if refused is not None and _error_type(resp) == refused[0]:
            raise refused[1](f"router refused {method} {path}: {_error_message(resp)}")
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


def _error_type(resp: httpx.Response) -> str | None:
    try:
        return str(resp.json()["error"]["type"])
    except (ValueError, KeyError, TypeError):
        return None


def _set(**fields: str | None) -> dict[str, str]:
    """The fields given (not None), for a JSON body."""
    return {k: v for k, v in fields.items() if v is not None}


def _request_past_handover(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.request``, retried while the router answers that it is handing over to a new process: each retry
    opens a new connection, which the new process accepts once the old one has closed its listener."""
    deadline = time.monotonic() + HANDOVER_RETRY_S
    while True:
        resp = httpclient.request(method, url, **kwargs)
        if resp.status_code != 503 or HANDOVER_HEADER not in resp.headers or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)
