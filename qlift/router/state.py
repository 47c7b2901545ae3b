"""What an operator set through the admin API, kept across a router restart.

A small JSON file (``state_file``; default: ``<config>.state.json`` beside ``--config``),
written atomically on every admin change and read at start, where its weights win over the
configured ones (those are the fallback). A file that does not fit the configured backends,
or cannot be read, is ignored with one warning line; a failed write is logged, never fatal.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qlift.fsutil import write_json_atomic
from qlift.router.config import check_weights
from qlift.router.wire import ShadowSettings

log = logging.getLogger(__name__)


class SavedState:
    def __init__(self, path: Path | None) -> None:
        self.path = path

    def load(self, backends: list[str]) -> tuple[dict[str, int] | None, ShadowSettings | None]:
        """(weights, shadow settings) saved for these backends; (None, None) when there are none."""
        if self.path is None or not self.path.exists():
            return None, None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            weights = check_weights(data["weights"], backends)
            if set(data["weights"]) != set(backends):
                raise ValueError(f"it names backends {sorted(data['weights'])}, the router has {sorted(backends)}")
            shadow = ShadowSettings.parse(data["shadow"], backends) if data.get("shadow") else None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("state file %s ignored (%s); using the configured weights", self.path, exc)
            return None, None
        log.info("weights %s from state file %s (saved %s)", weights, self.path, data.get("saved_at", "?"))
        return weights, shadow

    def save(self, weights: dict[str, int], shadow: ShadowSettings | None) -> bool:
        if self.path is None:
            return False
        data: dict[str, Any] = {"weights": weights, "shadow": shadow.as_dict() if shadow else None,
                                "saved_at": datetime.now(UTC).isoformat(timespec="seconds")}
        try:
            write_json_atomic(self.path, data)
        except OSError as exc:
            log.warning("could not write state file %s: %s (the change holds until the router stops)",
                        self.path, exc.strerror or exc)
            return False
        return True
