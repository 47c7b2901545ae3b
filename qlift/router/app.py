"""The router's HTTP server: its lifecycle, the plain routes (/v1/models, /health, /metrics) and the
state both request paths share. The OpenAI routes are ``datapath.DataPath``; the admin API is ``admin.AdminApi``."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import signal
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from qlift.router.admin import AdminApi
from qlift.router.balancer import Backend, Balancer
from qlift.router.config import RouterConfig
from qlift.router.datapath import COMPLETIONS, PASSTHROUGH, DataPath
from qlift.router.filters import ContentFilter
from qlift.router.handover import (
    Carried,
    HandoverOffer,
    carried_state,
    close_after_handover,
    first_set,
    hold_admin_writes,
    inherit,
    let_connections_go,
)
from qlift.router.health import HealthChecker, models_of
from qlift.router.limits import ApiKeys, bearer_token, read_token_file
from qlift.router.live import backend_session
from qlift.router.metrics import RouterMetrics
from qlift.router.proxy import json_error
from qlift.router.serverlimits import (
    GuardedSite,
    connection_cap,
    install_log_guard,
    listen_error,
    raise_open_files_limit,
)
from qlift.router.shadow import Shadow, cancel_all
from qlift.router.state import SavedState
from qlift.router.wire import RouterState

__all__ = ["COMPLETIONS", "PASSTHROUGH", "Router", "serve"]

log = logging.getLogger(__name__)

VERSION_FIELDS = ("root", "parent")  # /v1/models fields that name a version: admin callers only


class Router:
    """Holds the backends, their pooled client sessions, health checks, metrics and shadow settings; serves
    the OpenAI routes through its ``data`` path and the admin API through ``AdminApi``."""

    def __init__(self, config: RouterConfig, *, admin_token: str | None = None,
                 content_filter: ContentFilter | None = None, carried: Carried | None = None) -> None:
        self.config = config
        self.admin_token = admin_token
        weights = config.weights()
        self.saved = SavedState(config.state_file)
        # With the backends the admin API added or re-pointed, if any; a router taken over hands over its own.
        saved = carried.adopt(self.saved, config.backends) if carried else self.saved.load(config.backends)
        saved_weights, saved_shadow = saved.weights, saved.shadow
        weights = saved_weights or weights
        self.balancer = Balancer([Backend(b.name, b.url, b.served_model, weights[b.name], model_hash=b.model_hash,
                                          spare=b.name in carried.spare if carried else
                                          not saved_weights and weights[b.name] == 0,
                                          pinned=b.served_model is not None)
                                  for b in saved.backends or config.backends],
                                 failover_to_zero_weight=config.failover_to_zero_weight)
        self.public_model = config.public_model
        self.shadow: Shadow | None = None
        self.set_shadow(Shadow(saved_shadow) if saved_shadow else None)
        self.keys = ApiKeys.load(config.api_keys_file) if config.api_keys_file else ApiKeys()
        self.metrics_token = read_token_file(config.metrics_token_file, "metrics_token_file") \
            if config.metrics_token_file else None
        self.metrics = RouterMetrics()
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.sessions: dict[str, aiohttp.ClientSession] = {}  # filled at start(), one pool per backend
        self.data = DataPath(self, content_filter)
        self.health: HealthChecker | None = None
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.took_over_from: int | None = None  # the pid of the router this one took over (--take-over)
        self.handover_to: int | None = None  # set while handing over to a new process (its pid, 0: unknown)
        self._unguard_logs: Callable[[], None] | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_request_bytes, middlewares=[hold_admin_writes(self)])
        app.on_response_prepare.append(close_after_handover(self))
        for path in COMPLETIONS + PASSTHROUGH:
            app.router.add_post(path, self.data.handle)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model_id:.+}", self.model_by_id)
        app.router.add_get("/health", self.health_route)
        app.router.add_get("/metrics", self.metrics_route)
        AdminApi(self).routes(app)
        app.on_cleanup.append(self._close_sessions)
        return app

    async def start(self, sock: socket.socket | None = None) -> str:
        """Open backend pools, run a first health round, listen (on ``sock``: a router's it took over); returns
        the router's URL."""
        srv = self.config.server
        try:  # a --host that is no address fails now, before any backend is asked
            await asyncio.get_running_loop().getaddrinfo(self.config.host, self.config.port)
        except OSError as exc:
            raise listen_error(self.config.host, self.config.port, exc) from None
        self._unguard_logs = install_log_guard(srv.log_interval_s)
        open_files = raise_open_files_limit()
        t = self.config.timeouts
        for b in self.balancer.backends:
            self.sessions[b.name] = backend_session(t)  # one keep-alive pool per backend
        h = self.config.health
        self.health = HealthChecker(lambda b: self.sessions[b.name], self.balancer.backends, interval_s=h.interval_s,
                                    timeout_s=h.timeout_s, failures=h.failures, on_change=self._health_changed,
                                    on_resolved=lambda b: self.save_state())
        await self.health.check_all()
        for b in self.balancer.backends:  # down at start: out of rotation until a check passes
            b.healthy = b.healthy and b.health_failures == 0
        self._resolve_public_model()
        for b in self.balancer.backends:
            self.metrics.init_backend(b.name, b.weight, b.healthy)
        self.health.start()
        # The drain is ours (stop()); aiohttp's own shutdown wait would come on top of it, twice.
        self.runner = web.AppRunner(self.build_app(), handler_cancellation=True, access_log=None,
                                    shutdown_timeout=0.1, keepalive_timeout=srv.keepalive_s)
        await self.runner.setup()
        site = GuardedSite(self.runner, self.config.host, self.config.port,
                           max_connections=connection_cap(srv.max_connections, open_files),
                           header_timeout_s=srv.header_timeout_s, on_refused=self.metrics.connections_refused.inc,
                           on_header_timeout=self.metrics.client_timeouts.labels("header").inc, sock=sock)
        try:
            await site.start()
        except OSError as exc:
            await self.stop()
            raise listen_error(self.config.host, self.config.port, exc) from None
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.config.host}:{port}"
        return self.url

    async def stop(self, *, handed_over: bool = False) -> None:
        """Stop listening, let in-flight requests finish (up to drain_s, once), then close everything.
        ``handed_over``: another process listens on the socket now, so client connections are let go too."""
        if self.runner is not None:
            deadline = asyncio.get_running_loop().time() + self.config.drain_s
            for site in list(self.runner.sites):
                await site.stop()
            server = self.runner.server
            if handed_over and server is not None:
                await let_connections_go(lambda: list(server.connections), deadline)
            idle = self.data.idle
            if not idle.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(deadline):
                        await idle.wait()
                if not idle.is_set():
                    log.warning("drain_s (%g s) is over: cutting %d request(s) still in flight",
                                self.config.drain_s, self.data.active)
        if self.health is not None:
            await self.health.stop()
        await cancel_all(self.data.shadow_tasks)
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        self.data.access_log.close()
        if self._unguard_logs is not None:
            self._unguard_logs()
            self._unguard_logs = None

    async def _close_sessions(self, app: web.Application) -> None:
        for s in self.sessions.values():
            await s.close()

    def _health_changed(self, backend: Backend) -> None:
        self.metrics.healthy.labels(backend.name).set(int(backend.healthy))
        self._resolve_public_model()

    def _resolve_public_model(self) -> None:
        """Without --public-model, clients use the first backend's model name, once it is known.

        Until that backend has answered /v1/models, requests get 503: the public name never
        silently becomes something else (a backend's short name, another version's model).
        """
        if self.public_model is None and self.balancer.backends[0].served_model is not None:
            self.public_model = self.balancer.backends[0].served_model
            log.info("public model name is %r (backend %s's model)", self.public_model,
                     self.balancer.backends[0].name)

    # -- plain routes -------------------------------------------------------------------

    async def _model_entry(self, request: web.Request) -> dict[str, Any]:
        """The public model as a backend in rotation lists it (max_model_len, ...), under the public id.

        Its ``root`` (the model's directory, often named after the version) and ``parent`` (an
        adapter's base) would tell a client which version answers: only the admin token's caller sees them.
        """
        entry: dict[str, Any] = {"id": self.public_model, "object": "model", "created": 0, "owned_by": "qlift-router"}
        # The heaviest backend in rotation; not choose(), which would deal a card meant for a request.
        backend = max((b for b in self.balancer.backends if b.healthy and b.served_model), key=lambda b: b.weight,
                      default=None)
        if backend is not None:
            listed = await models_of(self.sessions[backend.name], backend, self.config.health.timeout_s)
            found = next((m for m in listed or [] if m.get("id") == backend.served_model), None)
            if found is not None:
                entry = {**found, "id": self.public_model}
                if not self.is_admin(request):
                    entry = {k: v for k, v in entry.items() if k not in VERSION_FIELDS}
        return entry

    async def models(self, request: web.Request) -> web.Response:
        if self.public_model is None:
            return json_error(503, "the public model name is not known yet (no answer from the first backend)",
                               "service_unavailable")
        return web.json_response({"object": "list", "data": [await self._model_entry(request)]})

    async def model_by_id(self, request: web.Request) -> web.Response:
        model_id = request.match_info["model_id"]
        if self.public_model is None or model_id != self.public_model:
            return json_error(404, f"The model {model_id!r} does not exist", "invalid_request_error",
                               "model_not_found")
        return web.json_response(await self._model_entry(request))

    async def health_route(self, request: web.Request) -> web.Response:
        healthy = [b.name for b in self.balancer.backends if b.healthy]
        return web.json_response({"status": "ok" if healthy else "unavailable", "healthy_backends": healthy},
                                 status=200 if healthy else 503)

    async def metrics_route(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        # Its series name API keys (rejected_total{key}): once there are keys or an admin token, the
        # admin token or metrics_token_file's token reads it; a client's API key does not.
        guarded = self.admin_token is not None or self.metrics_token is not None or not self.keys.open
        if guarded and not self._presents(request, self.admin_token, self.metrics_token):
            return json_error(401, "/metrics needs Authorization: Bearer with the admin token or the token in "
                               "metrics_token_file (Prometheus: authorization.credentials_file)",
                               "authentication_error")
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- admin API ----------------------------------------------------------------------

    @staticmethod
    def _presents(request: web.Request, *tokens: str | None) -> bool:
        """The caller's ``Authorization: Bearer`` is one of ``tokens`` (None: not set)."""
        given = (bearer_token(request.headers.get("Authorization")) or "").encode()
        return any(t is not None and hmac.compare_digest(given, t.encode()) for t in tokens)

    def is_admin(self, request: web.Request) -> bool:
        """The caller presents the admin token (``Authorization: Bearer $QLIFT_ROUTER_TOKEN``)."""
        return self._presents(request, self.admin_token)

    def state(self) -> RouterState:
        return RouterState(public_model=self.public_model, weights=self.balancer.weights,
                           backends=[b.wire_state() for b in self.balancer.backends], started_at=self.started_at,
                           seq=self.data.seq, shadow=self.shadow.state() if self.shadow else None)

    def save_state(self) -> None:
        """Keep what the admin API set (weights, shadow settings, backends) for the next start (``state_file``)."""
        self.saved.save(self.balancer.weights, self.shadow.settings if self.shadow else None,
                        backends=self.balancer.backends)

    def set_shadow(self, shadow: Shadow | None) -> None:
        self.shadow = shadow
        self.balancer.not_spare = {shadow.settings.version} if shadow else set()


async def serve(config: RouterConfig, *, admin_token: str | None, on_ready: Callable[[Router], None],
                content_filter: ContentFilter | None = None, restore_signals: bool = True,
                take_over: bool = False) -> None:
    """Run the router until SIGINT or SIGTERM, or until a new process took it over, then drain.

    ``take_over``: first take over the router listening on the configured host and port, if one is
    (``qlift.router.handover``). The signal handlers stay during the drain (a second signal does not
    cut it short) and, with ``restore_signals=False`` (the CLI, about to exit), after it too, so a late
    signal cannot turn a clean stop into a kill.
    """
    inherited = inherit(config.host, config.port) if take_over else None
    try:
        carried = carried_state(inherited, config.backends) if inherited else None
        router = Router(config, admin_token=admin_token, content_filter=content_filter, carried=carried)
    except BaseException:
        if inherited is not None:
            inherited.abandon()
        raise
    offer: HandoverOffer | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int, frame: object) -> None:
        loop.call_soon_threadsafe(stop.set)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            await router.start(sock=inherited.sock if inherited else None)
        except BaseException:
            if inherited is not None:
                inherited.abandon()
            raise
        if inherited is not None:
            inherited.confirm()
            router.took_over_from = inherited.pid
            router.save_state()
            log.info("took over from the router with pid %d: it drains and exits", inherited.pid)
        offer = HandoverOffer.of(router)
        on_ready(router)
        if await first_set(stop, *([offer.done] if offer else [])) is stop:
            log.info("stopping: draining in-flight requests (up to %g s)", config.drain_s)
    finally:
        if offer is not None:
            await offer.close()
        await router.stop(handed_over=offer is not None and offer.done.is_set())
        if restore_signals:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
