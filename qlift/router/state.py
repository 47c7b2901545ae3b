"""What an operator set through the admin API, kept across a router restart.

A small JSON file (``state_file``; default: ``<config>.state.json`` beside ``--config``),
written atomically on every admin change and read at start, where its weights win over the
configured ones (those are the fallback). A file that does not fit the configured backends,
or cannot be read, is ignored with one warning line; a failed write is logged, never fatal.

It also keeps the backend list (``backends``: name, url, the pinned ``served_model``, ``model_hash``) and a
fingerprint of the configured list it started from (``configured``): backends added, re-pointed or retired
through the admin API come back at the next start with the same configuration; a configuration whose backends
changed since wins, and the file is then ignored with one warning line.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qlift.fsutil import write_json_atomic
from qlift.router.balancer import Backend
from qlift.router.config import BackendConfig, check_weights
from qlift.router.wire import ShadowSettings

log = logging.getLogger(__name__)


@dataclass
class Saved:
    """What a state file gives back at start (all None: use the configuration)."""

    weights: dict[str, int] | None = None
    shadow: ShadowSettings | None = None
    backends: list[BackendConfig] | None = None  # the backend list the admin API left, when it changed it


def spec_of(backend: Backend | BackendConfig) -> dict[str, Any]:
    """A backend as the state file keeps it: the model only when pinned (an unpinned one resolves at start)."""
    pinned = backend.pinned if isinstance(backend, Backend) else True
    model = backend.served_model if pinned else None
    return {"name": backend.name, "url": backend.url, "served_model": model, "model_hash": backend.model_hash}


def fingerprint(backends: Sequence[Backend | BackendConfig]) -> str:
    """The backend list's identity (its URLs, which may hold credentials, are not written twice)."""
    text = json.dumps([spec_of(b) for b in backends], sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


class SavedState:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.configured: str | None = None  # the configured backends' fingerprint, from load()

    def load(self, configured: list[BackendConfig]) -> Saved:
        """What was saved for these configured backends; ``Saved()`` when nothing fits."""
        self.configured = fingerprint(configured)
        if self.path is None or not self.path.exists():
            return Saved()
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            backends = _live_backends(data, self.configured)
            names = [b.name for b in backends or configured]
            weights = check_weights(data["weights"], names)
            if set(data["weights"]) != set(names):
                raise ValueError(f"it names backends {sorted(data['weights'])}, the router has {sorted(names)}")
            shadow = ShadowSettings.parse(data["shadow"], names) if data.get("shadow") else None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("state file %s ignored (%s); using the configured weights", self.path, exc)
            return Saved()
        if backends is not None:
            log.info("backends %s from state file %s (changed through the admin API)", ", ".join(names), self.path)
        log.info("weights %s from state file %s (saved %s)", weights, self.path, data.get("saved_at", "?"))
        return Saved(weights, shadow, backends)

    def save(self, weights: dict[str, int], shadow: ShadowSettings | None,
             backends: Sequence[Backend] | None = None) -> bool:
        if self.path is None:
            return False
        data: dict[str, Any] = {"weights": weights, "shadow": shadow.as_dict() if shadow else None,
                                "saved_at": datetime.now(UTC).isoformat(timespec="seconds")}
        if backends is not None:
            data |= {"backends": [spec_of(b) for b in backends], "configured": self.configured}
        try:
            write_json_atomic(self.path, data)
        except OSError as exc:
            log.warning("could not write state file %s: %s (the change holds until the router stops)",
                        self.path, exc.strerror or exc)
            return False
        return True


def _live_backends(data: dict[str, Any], configured: str) -> list[BackendConfig] | None:
    """The saved backend list when the admin API changed it since a start with this configuration; None when
    it did not (the configuration's list stands). ValueError when it changed and so did the configuration."""
    if data.get("backends") is None:
        return None
    backends = [BackendConfig.model_validate(b) for b in data["backends"]]
    if fingerprint(backends) == data.get("configured"):
        return None
    if data.get("configured") != configured:
        raise ValueError("its backends were changed through the admin API, and the configured backends changed "
                         "since; the configuration wins")
    return backends
