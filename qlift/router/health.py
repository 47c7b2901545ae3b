"""Active health checks: each backend's /health on an interval; failing ones leave the rotation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from qlift.router.balancer import Backend

log = logging.getLogger(__name__)


IDENTITY = {"Accept-Encoding": "identity"}


async def models_of(session: aiohttp.ClientSession, backend: Backend, timeout_s: float) -> list[dict[str, Any]] | None:
    """The model entries the backend lists at /v1/models, or None if it does not answer with a list."""
    try:
        async with asyncio.timeout(timeout_s), session.get(backend.url + "/v1/models", headers=IDENTITY) as resp:
            if resp.status != 200:
                return None
            data = await resp.json(content_type=None)
            entries = [m for m in data["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
            return entries or None
    except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError):
        return None


async def answers(session: aiohttp.ClientSession, url: str, timeout_s: float) -> bool:
    try:
        async with asyncio.timeout(timeout_s), session.get(url, headers=IDENTITY) as resp:
            await resp.read()
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False


async def check_once(session: aiohttp.ClientSession, backend: Backend, timeout_s: float) -> bool:
    """/health answers 200 (or, for a vllm-router pool with a replica down, /readiness does), and the backend
    lists its model (checked once per healthy spell)."""
    ok = await answers(session, backend.url + "/health", timeout_s)
    if not ok:  # vllm-router's /health is 503 while any replica is down; /readiness is 200 while one is up
        ok = await answers(session, backend.url + "/readiness", timeout_s)
    if not ok:
        backend.model_listed = False  # it may come back serving something else
        backend.went_away = True
        return False
    if backend.model_listed:
        return True
    listed = await models_of(session, backend, timeout_s)
    if listed is None:
        return False
    ids = [m["id"] for m in listed]
    if backend.served_model is None:
        backend.served_model = ids[0]
    elif backend.served_model not in ids and not backend.pinned and backend.went_away:
        # Its server came back serving another version (a role swap): the router follows it. One that stayed up
        # and dropped its model (an adapter unloaded) is a fault, not a new version: that stays out of rotation.
        log.warning("backend %s now serves %r, no longer %r: re-resolved from its /v1/models (its model is not "
                    "pinned)%s", backend.name, ids[0], backend.served_model,
                    f"; model_hash {backend.model_hash} dropped" if backend.model_hash else "")
        backend.served_model, backend.model_hash = ids[0], None
    elif backend.served_model not in ids:
        problem = unlisted(backend, ids)
        if backend.problem != problem:
            log.warning("backend %s: %s", backend.name, problem)
            backend.problem = problem
        return False
    entry = next(m for m in listed if m["id"] == backend.served_model)
    root, parent = entry.get("root"), entry.get("parent")
    backend.served_root = None if root is None else f"{root}" + (f" on {parent}" if parent else "")
    backend.model_listed, backend.problem, backend.went_away = True, None, False
    return True


def unlisted(backend: Backend, ids: list[str]) -> str:
    """Why a backend whose model its server no longer lists is out of rotation, naming both models and the admin
    call that makes it serve what the server lists."""
    head = f"model {backend.served_model!r} is not listed at /v1/models (it lists {', '.join(ids)})"
    if not backend.pinned:  # its server stayed up: no restart to follow
        return (f"{head}; its server did not restart: to serve {ids[0]!r}, POST /admin/backends/{backend.name}/"
                f"resolve (RouterClient.resolve_backend)")
    return (f"{head}; the backend is pinned to it: to serve {ids[0]!r}, PUT /admin/backends/{backend.name} "
            f"{json.dumps({'model': ids[0]})} (RouterClient.repoint_backend), or point its URL at a server of "
            f"{backend.served_model!r}")


class HealthChecker:
    def __init__(self, session_for: Callable[[Backend], aiohttp.ClientSession], backends: list[Backend], *,
                 interval_s: float, timeout_s: float, failures: int,
                 on_change: Callable[[Backend], None],
                 on_resolved: Callable[[Backend], None] | None = None) -> None:
        self.session_for = session_for
        self.backends = backends
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.failures = failures
        self.on_change = on_change
        self.on_resolved = on_resolved  # a backend took another model (to keep it in the state file)
        self._task: asyncio.Task[None] | None = None

    async def check_all(self) -> None:
        backends = list(self.backends)  # the admin API may add or retire one while the checks run
        models = [b.served_model for b in backends]
        results = await asyncio.gather(*(check_once(self.session_for(b), b, self.timeout_s) for b in backends))
        for backend, ok, model in zip(backends, results, models, strict=True):
            if not any(b is backend for b in self.backends):
                continue  # retired while it was checked
            self.record(backend, ok)
            if model is not None and backend.served_model != model and self.on_resolved is not None:
                self.on_resolved(backend)

    def record(self, backend: Backend, ok: bool) -> None:
        was = backend.healthy
        if ok:
            backend.health_failures = 0
            backend.healthy = True
        else:
            backend.health_failures += 1
            if backend.health_failures >= self.failures or backend.served_model is None:
                backend.healthy = False
        if was != backend.healthy:
            log.warning("backend %s is %s", backend.name, "healthy again" if backend.healthy else "out of rotation")
            self.on_change(backend)

    def mark_down(self, backend: Backend, why: str = "connection failed") -> None:
        """A request could not connect: out of rotation now, back when a check passes."""
        backend.health_failures = max(backend.health_failures, self.failures)
        if backend.healthy:
            backend.healthy = False
            log.warning("backend %s is out of rotation (%s)", backend.name, why)
            self.on_change(backend)

    def model_gone(self, backend: Backend) -> None:
        """A request was told the backend's model does not exist: out of rotation until /v1/models lists it again."""
        backend.model_listed = False
        backend.problem = f"model {backend.served_model!r} answered 404 (no longer served); waiting for /v1/models"
        self.mark_down(backend, "its model answered 404")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_all()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
