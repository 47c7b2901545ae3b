"""The router's backends as live objects: add, re-point, retire and re-resolve one while the router serves
(the admin API's ``/admin/backends`` calls; docs/router.md "Live backends").

Every change is probed first (``/health`` and ``/v1/models`` of the server it names, on a copy of the backend),
then applied in one synchronous step, so no request sees half of it; requests in flight finish on the
connection pool they started on, which is closed once the longest request could have ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import aiohttp
from pydantic import ValidationError

from qlift.router.backend_change import BackendChange, Change
from qlift.router.balancer import Backend
from qlift.router.config import BackendConfig, TimeoutsConfig, redact_url
from qlift.router.health import check_once, models_of, unlisted

if TYPE_CHECKING:
    from qlift.router.app import Router

log = logging.getLogger("qlift.router.app")

ADD_FIELDS = {"name", "url", "model", "model_hash"}
REPOINT_FIELDS = {"url", "model", "model_hash"}


class BackendRefused(Exception):
    """A live-backend call the router refuses: its HTTP status and one line saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def backend_session(timeouts: TimeoutsConfig) -> aiohttp.ClientSession:
    """One keep-alive pool for a backend; per-phase timeouts are applied per request. A pooled connection
    outliving the backend's keep-alive races its close: a request sent on it dies. Bodies are asked for
    uncompressed (the router rewrites them); one compressed anyway is decoded here."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=timeouts.keepalive_s, enable_cleanup_closed=True)
    return aiohttp.ClientSession(connector=connector,
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s))


def _fields(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BackendRefused(400, f"the body must be a JSON object with {', '.join(sorted(allowed))}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BackendRefused(400, f"unknown field {unknown[0]!r}; known: {', '.join(sorted(allowed))}")
    for key in ("url", "model", "model_hash", "name"):
        if body.get(key) is not None and (not isinstance(body[key], str) or not body[key]):
            raise BackendRefused(400, f"{key} must be a non-empty string, got {body[key]!r}")
    return body


def _spec(name: str, url: str, model: str | None, model_hash: str | None) -> BackendConfig:
    """The backend as the config file would give it, checked the same way (a URL#MODEL names its model)."""
    try:
        return BackendConfig(name=name, url=url, served_model=model, model_hash=model_hash)
    except ValidationError as exc:
        raise BackendRefused(400, str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None


def _serving(b: Backend) -> str:
    model = repr(b.served_model) if b.served_model else "a model not known yet"
    return f"{redact_url(b.url)} serving {model}{' (pinned)' if b.pinned else ''}"


class LiveBackends:
    def __init__(self, router: Router) -> None:
        self.router = router
        self._lock = asyncio.Lock()  # one change at a time: each reads what the last one left
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, name: str) -> Backend:
        backend = self.router.balancer.by_name.get(name)
        if backend is None:
            known = ", ".join(b.name for b in self.router.balancer.backends)
            raise BackendRefused(404, f"no backend {name!r}; known: {known}")
        return backend

    # -- the calls ----------------------------------------------------------------------

    async def add(self, body: Any) -> BackendChange:
        """A new backend at weight 0, out of rotation until its server answers with a model."""
        fields = _fields(body, ADD_FIELDS)
        if not fields.get("name") or not fields.get("url"):
            raise BackendRefused(400, 'a new backend needs {"name", "url"} (and "model" to pin its model)')
        spec = _spec(fields["name"], fields["url"], fields.get("model"), fields.get("model_hash"))
        async with self._lock:
            if spec.name in self.router.balancer.by_name:
                raise BackendRefused(409, f"backend {spec.name!r} exists (at {_serving(self.get(spec.name))}); "
                                          f"re-point it with PUT /admin/backends/{spec.name}")
            session = backend_session(self.router.config.timeouts)
            backend = Backend(spec.name, spec.url, spec.served_model, 0, healthy=False, model_hash=spec.model_hash,
                              pinned=spec.served_model is not None)
            ok = await check_once(session, backend, self.router.config.health.timeout_s)
            self.router.sessions[backend.name] = session
            self._take(backend, backend, ok)
            self.router.balancer.add(backend)
            self.router.metrics.init_backend(backend.name, 0, backend.healthy)
            return self._done("added", backend, f"added backend {backend.name} at {_serving(backend)}, weight 0")

    async def repoint(self, name: str, body: Any) -> BackendChange:
        """A new URL and/or model: ``model`` a name pins it, null unpins it (its server's model is taken)."""
        fields = _fields(body, REPOINT_FIELDS)
        if not fields:
            raise BackendRefused(400, 'a re-point needs "url", "model" or "model_hash"')
        async with self._lock:
            backend = self.get(name)
            url_model = _spec(name, fields.get("url") or backend.url, None, None)
            model_given = "model" in fields or url_model.served_model is not None
            model = url_model.served_model or fields.get("model")
            if not model_given:
                model = backend.served_model if backend.pinned or url_model.url == backend.url else None
            pinned = model is not None if model_given else backend.pinned
            probe = self._probe_of(backend, url=url_model.url, served_model=model, pinned=pinned)
            if "model_hash" in fields:
                probe.model_hash = fields["model_hash"]
            session = self._session_for(backend, url_model.url)
            ok = await check_once(session, probe, self.router.config.health.timeout_s)
            if probe.served_model != backend.served_model and "model_hash" not in fields:
                probe.model_hash = None  # the hash was of the version it served before
            before = _serving(backend)
            if session is not self.router.sessions[name]:
                self._close_later(self.router.sessions[name])
                self.router.sessions[name] = session
            self._take(backend, probe, ok)
            return self._done("repointed", backend, f"backend {name} now at {_serving(backend)} (was {before})")

    async def retire(self, name: str) -> BackendChange:
        """Out of the router for good; refused while it has weight or the shadow names it."""
        async with self._lock:
            backend = self.get(name)
            if backend.weight > 0:
                raise BackendRefused(409, f"backend {name} has weight {backend.weight}: move it to the other "
                                          f"backends first (PUT /admin/weights), then retire it")
            shadow = self.router.shadow
            if shadow is not None and name in (shadow.settings.version, shadow.settings.partner):
                raise BackendRefused(409, f"backend {name} is in the shadow settings: turn shadow traffic off "
                                          f"first (DELETE /admin/shadow), then retire it")
            if len(self.router.balancer.backends) == 1:
                raise BackendRefused(409, f"backend {name} is the router's last backend: add another first")
            self.router.balancer.remove(name)
            self._close_later(self.router.sessions[name], name)  # a request that chose it may still look it up
            for gauge in (self.router.metrics.weight, self.router.metrics.healthy, self.router.metrics.in_flight):
                with contextlib.suppress(KeyError):
                    gauge.remove(name)
            return self._done("retired", backend, f"retired backend {name} (was at {_serving(backend)}, weight 0)")

    async def resolve(self, name: str, body: Any) -> BackendChange:
        """Re-read its server's /v1/models: an unpinned backend takes the model listed (its own while still
        listed); a pinned one only with ``pin`` (it then stays pinned, to the model taken)."""
        fields = _fields(body if body is not None else {}, {"pin"})
        pin = fields.get("pin", False)
        if not isinstance(pin, bool):
            raise BackendRefused(400, f"pin must be true or false, got {pin!r}")
        async with self._lock:
            backend = self.get(name)
            session, timeout_s = self.router.sessions[name], self.router.config.health.timeout_s
            listed = await models_of(session, backend, timeout_s)
            ids = [m["id"] for m in listed or []]
            if backend.pinned and not pin and ids and backend.served_model not in ids:
                raise BackendRefused(409, f"backend {name}: {unlisted(backend, ids)}; or re-resolve with "
                                          f'{{"pin": true}} to take what it lists')
            model = backend.served_model if backend.served_model in ids else None  # None: the first listed
            probe = self._probe_of(backend, url=backend.url, served_model=model, pinned=False)
            if not ids or not await check_once(session, probe, timeout_s):
                raise BackendRefused(503, f"backend {name}'s server at {redact_url(backend.url)} does not answer "
                                          f"/health and /v1/models: nothing re-resolved; try again once it serves")
            probe.pinned = backend.pinned or pin
            if probe.served_model != backend.served_model:
                probe.model_hash = None  # the hash was of the version it served before
            before = backend.served_model
            self._take(backend, probe, True)
            if backend.served_model == before:
                return self._done("unchanged", backend, f"backend {name} still serves {before!r}", save=pin)
            return self._done("resolved", backend, f"backend {name} now serves {backend.served_model!r} "
                                                   f"(was {before!r}), from its /v1/models")

    async def close(self, app: object = None) -> None:
        """Close the pools of replaced and retired backends now (the router is stopping)."""
        tasks = list(self._closing)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- helpers ------------------------------------------------------------------------

    @staticmethod
    def _probe_of(backend: Backend, *, url: str, served_model: str | None, pinned: bool) -> Backend:
        """A copy of ``backend`` to check a change on, before any request can see it."""
        return dataclasses.replace(backend, url=url, served_model=served_model, pinned=pinned, model_listed=False,
                                   problem=None, served_root=None, went_away=True)  # a fresh look at its server

    def _session_for(self, backend: Backend, url: str) -> aiohttp.ClientSession:
        """Its pool when the server stays the same, else a new one (the old one closes later)."""
        same = url == backend.url
        return self.router.sessions[backend.name] if same else backend_session(self.router.config.timeouts)

    def _take(self, backend: Backend, probe: Backend, ok: bool) -> None:
        """What the probe found, onto the live backend in one step (no await: no request sees half of it)."""
        for field in ("url", "served_model", "pinned", "model_hash", "served_root", "model_listed", "problem",
                      "went_away"):
            setattr(backend, field, getattr(probe, field))
        was = backend.healthy
        health = self.router.health
        backend.health_failures = 0 if ok else max(backend.health_failures, health.failures if health else 1)
        backend.healthy = ok
        if was != ok and health is not None and backend.name in self.router.balancer.by_name:
            health.on_change(backend)

    def _done(self, change: Change, backend: Backend, message: str, save: bool = True) -> BackendChange:
        if change != "retired" and not backend.healthy:
            message += f"; out of rotation: {backend.problem}" if backend.problem else \
                "; out of rotation until its server answers /health and /v1/models"
        log.info("%s", message)
        if save:
            self.router.save_state()
        return BackendChange(change=change, backend=backend.name, message=message,
                             pinned=None if change == "retired" else backend.pinned, state=self.router.state())

    def _close_later(self, session: aiohttp.ClientSession, retired: str | None = None) -> None:
        """Close a pool once every request that may still use it has met its deadline (timeouts.request_s);
        a ``retired`` backend's pool then leaves the router's sessions too (unless a new one took its name)."""

        async def close() -> None:
            try:
                await asyncio.sleep(self.router.config.timeouts.request_s)
            finally:
                if retired is not None and self.router.sessions.get(retired) is session:
                    del self.router.sessions[retired]
                await session.close()

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
