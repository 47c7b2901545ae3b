"""Optional webhook: a JSON POST on each decision (chat notifications). Failures are logged, never fatal."""

from __future__ import annotations

import logging
from typing import Any

import httpx

log = logging.getLogger(__name__)


def notify(url: str | None, payload: dict[str, Any], timeout: float = 5.0) -> None:
    if not url:
        return
    try:
        httpx.post(url, json=payload, timeout=timeout).raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("webhook %s failed: %s", url, exc)
