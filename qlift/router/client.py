"""Typed client for the router's admin API (what `qlift promote` drives).

The admin API lives on the router's own port and answers only with
``Authorization: Bearer $QLIFT_ROUTER_TOKEN``.
"""

from __future__ import annotations

from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from qlift.errors import BadInputError, ExternalToolError
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
__all__ = ["AnswerRecord", "BackendState", "RequestBatch", "RequestRecord", "RouterClient", "RouterState",
           "ShadowAnswer", "ShadowBatch", "ShadowPair", "ShadowState"]

Wire = TypeVar("Wire", bound=BaseModel)


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
