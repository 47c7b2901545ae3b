"""The canary's identity, checked every window: a rollout never judges a new model on the old one's evidence.

The data plane names what each version serves (the qlift router: the backend's configured ``model_hash``,
else the ``root`` its server lists for the served model at /v1/models, which a restart with another model
dir or a re-loaded adapter changes). The first window journals the canary's identity (event
``canary_identity``); a later window that finds another one is not judged: the rollout pauses and says so
(event ``canary_changed``), and ``promote resume`` restarts the step's analysis with the new model, as
Flagger restarts its analysis when the canary revision changes. Planes that cannot tell (not ``Identifies``)
are not checked.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from qlift.errors import QliftError
from qlift.rollout.dataplane import Identifies
from qlift.rollout.states import EventKind

if TYPE_CHECKING:
    from qlift.rollout.dataplane import DataPlane
    from qlift.rollout.journal import Journal

log = logging.getLogger(__name__)


def plane_identity(plane: DataPlane, version: str) -> str | None:
    if not isinstance(plane, Identifies):
        return None
    try:
        value = plane.identity(version)
    except QliftError as exc:  # unreadable now: the weights check of the same window says so
        log.debug("could not read %s's identity: %s", version, exc.one_line())
        return None
    return None if value is None else str(value)


def journaled_identity(journal: Journal, rollout_id: int) -> str | None:
    detail = journal.last_event(rollout_id, (EventKind.CANARY_IDENTITY, EventKind.CANARY_CHANGED))
    identity = None if detail is None else detail.get("identity")
    return None if identity is None else str(identity)


def canary_changed(journal: Journal, rollout_id: int, plane: DataPlane, canary: str) -> str | None:
    """Why this window must not be judged (the canary's model changed since the rollout first saw it), or None.
    The first identity seen, and every change, are journaled; the next window judges the new model afresh."""
    now = plane_identity(plane, canary)
    if now is None:
        return None
    before = journaled_identity(journal, rollout_id)
    if before is None:
        journal.log_event(rollout_id, EventKind.CANARY_IDENTITY, {"identity": now})
        return None
    if before == now:
        return None
    journal.log_event(rollout_id, EventKind.CANARY_CHANGED, {"identity": now, "before": before})
    return (f"the canary's model changed under the rollout ({before} -> {now}): the evidence so far is the old "
            f"model's; `qlift promote resume` restarts this step's analysis with the new one")
