"""The router stage's entry point: ``run(RouterInputs, RouterConfig) -> RouterResult``.

``RouterConfig`` is the stage's options (backends, weights, limits, ...); the admin token is an input, kept out
of the config so a dumped config never carries it. ``run`` serves until SIGINT or SIGTERM, then drains.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qlift.router.config import RouterConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouterInputs:
    """The admin API's bearer token (None: no admin API), as QLIFT_ROUTER_TOKEN gives it to ``qlift router``."""

    admin_token: str | None = None


@dataclass
class RouterResult:
    url: str  # where it listened
    public_model: str | None


def run(inputs: RouterInputs, options: RouterConfig) -> RouterResult:
    """Start the router, log where it is ready, and block until it is stopped and drained."""
    from qlift.router.app import Router, serve

    ready: list[RouterResult] = []

    def on_ready(router: Router) -> None:
        ready.append(RouterResult(url=router.url, public_model=router.public_model))
        log.info("router ready at %s", router.url)

    asyncio.run(serve(options, admin_token=inputs.admin_token, on_ready=on_ready))
    return ready[0]
