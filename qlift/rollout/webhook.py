"""Optional webhook: a JSON POST on each decision (chat notifications).

The URL is checked before a rollout starts (``validate_webhook``); at run time a failure of
any kind is logged and counted, never fatal: the controller keeps watching the canary.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Any

import httpx

from qlift import httpclient
from qlift.errors import BadInputError

log = logging.getLogger(__name__)


class WebhookAction(StrEnum):
    """A payload's ``action``: a judged window's phase (states.Phase, same values) or a decision without one."""

    ADVANCE = "advance"
    PASS = "pass"
    HOLD = "hold"
    ROLLBACK = "rollback"
    PAUSE = "pause"
    PROMOTED = "promoted"
    BAKE = "bake"
    BAKED = "baked"
    ABORT = "abort"
    PROMOTE = "promote"
    FINISH = "finish"


def validate_webhook(url: str | None) -> None:
    if not url:
        return
    try:
        parsed = httpx.URL(url)
        ok = parsed.scheme in ("http", "https") and bool(parsed.host)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise BadInputError(f"webhook URL '{url}' is not a valid URL ({exc})", field="--webhook",
                            hint="Pass an http(s)://HOST[:PORT]/PATH URL.") from None
    if not ok:
        raise BadInputError(f"webhook URL '{url}' needs http:// or https:// and a host", field="--webhook",
                            hint="Pass an http(s)://HOST[:PORT]/PATH URL.")


def notify(url: str | None, payload: dict[str, Any], timeout: float = 5.0) -> str | None:
    """POST ``payload``; returns None when delivered (or no URL), else what went wrong."""
    if not url:
        return None
    try:
        httpclient.post(url, json=payload, timeout=timeout).raise_for_status()
    except Exception as exc:  # a webhook never ends the controller, whatever it raises
        log.warning("webhook %s failed: %s: %s", url, type(exc).__name__, exc)
        return f"{type(exc).__name__}: {exc}"
    return None
