"""The router's admin API (``Authorization: Bearer $QLIFT_ROUTER_TOKEN``): its state, weights, shadow
settings and pairs, its live backends (``live.LiveBackends``), and the request log a rollout reads. The data
path is ``datapath.DataPath``."""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from qlift.router.backend_change import BackendChange
from qlift.router.config import check_weights
from qlift.router.live import BackendRefused, LiveBackends
from qlift.router.proxy import MAX_JSON_DEPTH, json_error
from qlift.router.shadow import Shadow
from qlift.router.wire import ShadowSettings

if TYPE_CHECKING:
    from qlift.router.app import Router

log = logging.getLogger("qlift.router.app")


async def _admin_json(request: web.Request) -> Any:
    """An admin call's JSON body; ValueError (a 400) for one that is not JSON or nests too deeply."""
    try:
        return json.loads(await request.read())
    except RecursionError:
        raise ValueError(f"request body nests deeper than {MAX_JSON_DEPTH} levels") from None


class AdminApi:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.live = LiveBackends(router)

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/admin/state", self.admin_state)
        app.router.add_put("/admin/weights", self.admin_weights)
        app.router.add_get("/admin/requests", self.admin_requests)
        app.router.add_put("/admin/shadow", self.admin_set_shadow)
        app.router.add_delete("/admin/shadow", self.admin_clear_shadow)
        app.router.add_get("/admin/shadow", self.admin_shadow_pairs)
        app.router.add_post("/admin/backends", self.admin_add_backend)
        app.router.add_put("/admin/backends/{name}", self.admin_repoint_backend)
        app.router.add_delete("/admin/backends/{name}", self.admin_retire_backend)
        app.router.add_post("/admin/backends/{name}/resolve", self.admin_resolve_backend)
        app.on_cleanup.append(self.live.close)

    def refusal(self, request: web.Request) -> web.Response | None:
        if self.router.admin_token is None:
            return json_error(401, "the admin API is off: start the router with QLIFT_ROUTER_TOKEN set",
                               "authentication_error")
        if not self.router.is_admin(request):
            return json_error(401, "missing or wrong admin token (Authorization: Bearer $QLIFT_ROUTER_TOKEN)",
                               "authentication_error")
        return None

    async def _backend_call(self, request: web.Request,
                            call: Callable[[Any], Awaitable[BackendChange]]) -> web.Response:
        """A live-backend change (``call`` gets the JSON body, None when empty): the change, or the refusal as
        one line (400, 404, 409, 503)."""
        refusal = self.refusal(request)
        if refusal is not None:
            return refusal
        try:
            body = None
            if await request.read():
                try:
                    body = await _admin_json(request)
                except ValueError as exc:
                    raise BackendRefused(400, f"the body is not JSON: {exc}") from None
            change = await call(body)
        except BackendRefused as exc:
            kind = {404: "not_found_error", 409: "conflict_error", 503: "service_unavailable"}
            return json_error(exc.status, exc.message, kind.get(exc.status, "invalid_request_error"))
        return web.json_response(change.model_dump())

    async def admin_add_backend(self, request: web.Request) -> web.Response:
        return await self._backend_call(request, self.live.add)

    async def admin_repoint_backend(self, request: web.Request) -> web.Response:
        return await self._backend_call(request, lambda body: self.live.repoint(request.match_info["name"], body))

    async def admin_retire_backend(self, request: web.Request) -> web.Response:
        return await self._backend_call(request, lambda body: self.live.retire(request.match_info["name"]))

    async def admin_resolve_backend(self, request: web.Request) -> web.Response:
        return await self._backend_call(request, lambda body: self.live.resolve(request.match_info["name"], body))

    async def admin_state(self, request: web.Request) -> web.Response:
        return self.refusal(request) or web.json_response(self.router.state().model_dump())

    async def admin_weights(self, request: web.Request) -> web.Response:
        refusal = self.refusal(request)
        if refusal is not None:
            return refusal
        try:
            weights = check_weights(await _admin_json(request), [b.name for b in self.router.balancer.backends])
        except ValueError as exc:  # json errors are ValueErrors too
            return json_error(400, str(exc), "invalid_request_error")
        self.router.balancer.set_weights(weights)
        for name, w in weights.items():
            self.router.metrics.weight.labels(name).set(w)
        log.info("weights now %s", weights)
        self.router.save_state()
        return web.json_response(self.router.state().model_dump())

    async def admin_set_shadow(self, request: web.Request) -> web.Response:
        refusal = self.refusal(request)
        if refusal is not None:
            return refusal
        try:
            settings = ShadowSettings.parse(await _admin_json(request), [b.name for b in self.router.balancer.backends])
        except ValueError as exc:
            return json_error(400, str(exc), "invalid_request_error")
        if self.router.shadow is not None and self.router.shadow.settings.version == settings.version:
            self.router.shadow.settings = settings  # same target: the counters go on
        else:
            self.router.set_shadow(Shadow(settings))  # copies in flight finish; their pairs are filed
        log.info("shadow now %s", settings.as_dict())
        self.router.save_state()
        return web.json_response(self.router.state().model_dump())

    async def admin_clear_shadow(self, request: web.Request) -> web.Response:
        refusal = self.refusal(request)
        if refusal is not None:
            return refusal
        if self.router.shadow is not None:
            log.info("shadow off (%d copies sent, %d dropped)", self.router.shadow.sent, self.router.shadow.dropped)
            self.router.set_shadow(None)
            self.router.save_state()
        return web.json_response(self.router.state().model_dump())

    async def admin_shadow_pairs(self, request: web.Request) -> web.Response:
        refusal = self.refusal(request)
        if refusal is not None:
            return refusal
        text = request.query.get("since", "0")
        if not text.isdigit() or len(text) > 18:
            return json_error(400, "since must be a non-negative integer (a pair's seq)", "invalid_request_error")
        return web.Response(body=self.router.data.pair_ring.since_json(int(text)), content_type="application/json")

    async def admin_requests(self, request: web.Request) -> web.Response:
        refusal = self.refusal(request)
        if refusal is not None:
            return refusal
        text = request.query.get("since", "0")
        if not re.fullmatch(r"-?[0-9]{1,18}", text):
            return json_error(400, "since must be an integer of at most 18 digits (a request record's seq)",
                               "invalid_request_error")
        since = int(text)
        data = self.router.data
        first = data.records[0]["seq"] if data.records else data.seq + 1
        start = max(0, since + 1 - first)
        records = list(itertools.islice(data.records, start, None))
        return web.json_response({"seq": data.seq, "requests": records})
