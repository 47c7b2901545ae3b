"""The router stage's entry points: ``run(RouterInputs, RouterConfig) -> RouterResult`` serves in the foreground
(``qlift router``); ``start`` (``qlift.router.handle``) serves in a process of its own and returns a handle.

``RouterConfig`` is the stage's options (backends, weights, limits, ...); the admin token is an input, kept out
of the config so a dumped config never carries it. ``run`` serves until SIGINT or SIGTERM (or until a new
process takes it over: ``qlift.router.handover``), then drains.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qlift.router.app import Router
    from qlift.router.config import RouterConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouterInputs:
    """The admin API's bearer token (None: no admin API), as QLIFT_ROUTER_TOKEN gives it to ``qlift router``;
    ``take_over``: take over the router running on the configured host and port, if any (``--take-over``)."""

    admin_token: str | None = None
    take_over: bool = False


@dataclass
class RouterResult:
    url: str  # where it listened
    public_model: str | None


def run(inputs: RouterInputs, options: RouterConfig, *, on_ready: Callable[[Router], None] | None = None,
        restore_signals: bool = True) -> RouterResult:
    """Start the router, tell ``on_ready`` (default: the log) where it is ready, and block until it is stopped
    and drained. ``restore_signals=False``: keep the SIGINT/SIGTERM handlers after it (a caller about to exit)."""
    from qlift.router.app import serve

    ready: list[RouterResult] = []

    def ready_at(router: Router) -> None:
        ready.append(RouterResult(url=router.url, public_model=router.public_model))
        if on_ready is None:
            log.info("router ready at %s", router.url)
        else:
            on_ready(router)

    asyncio.run(serve(options, admin_token=inputs.admin_token, on_ready=ready_at, restore_signals=restore_signals,
                      take_over=inputs.take_over))
    return ready[0]
