"""The canary's identity, checked every window: a rollout never judges a new model on the old one's evidence.

The data plane names what each version serves (the qlift router: the backend's configured ``model_hash``,
else the ``root`` its server lists for the served model at /v1/models, which a restart with another model
dir or a re-loaded adapter changes). The first window journals the canary's identity (event
``canary_identity``); a later window that finds another one is not judged: the rollout pauses and says so
(event ``canary_changed``), and ``promote resume`` restarts the step's analysis with the new model, as
Flagger restarts its analysis when the canary revision changes. Planes that cannot tell are not checked.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from qlift.errors import QliftError

log = logging.getLogger(__name__)


def plane_identity(plane: Any, version: str) -> str | None:
    identity = getattr(plane, "identity", None)
    if not callable(identity):
        return None
    try:
        value = identity(version)
    except QliftError as exc:  # unreadable now: the weights check of the same window says so
        log.debug("could not read %s's identity: %s", version, exc.one_line())
        return None
    return None if value is None else str(value)


def journaled_identity(journal: Any, rollout_id: int) -> str | None:
    row = journal.db.execute("SELECT detail FROM events WHERE rollout_id = ? AND kind IN ('canary_identity', "
                             "'canary_changed') ORDER BY id DESC LIMIT 1", (rollout_id,)).fetchone()
    return None if row is None else json.loads(row[0]).get("identity")


def canary_changed(journal: Any, rollout_id: int, plane: Any, canary: str) -> str | None:
    """Why this window must not be judged (the canary's model changed since the rollout first saw it), or None.
    The first identity seen, and every change, are journaled; the next window judges the new model afresh."""
    now = plane_identity(plane, canary)
    if now is None:
        return None
    before = journaled_identity(journal, rollout_id)
    if before is None:
        journal.log_event(rollout_id, "canary_identity", {"identity": now})
        return None
    if before == now:
        return None
    journal.log_event(rollout_id, "canary_changed", {"identity": now, "before": before})
    return (f"the canary's model changed under the rollout ({before} -> {now}): the evidence so far is the old "
            f"model's; `qlift promote resume` restarts this step's analysis with the new one")
