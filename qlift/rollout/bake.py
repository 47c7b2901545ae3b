"""The bake after 100% (``--bake N``, ``RolloutSpec.bake``), as Argo Rollouts' and Flagger's post-promotion
analysis: N more windows with the canary serving every user, judged by the same checks as the steps.

At 100% the stable serves nobody, so it has no figures of its own to compare with: its evidence from its last
judged window before the switch (answers included) is kept in the journal when the rollout advances to 100%,
and every bake window is judged against it. A failing window rolls back to the stable, which never stopped
(its backend stays in the data plane at weight 0); a passed bake leaves the rollout ``baked``, the stable
still running, until `qlift promote finish` records it released (``finished``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from qlift.errors import NotFoundError, QliftError
from qlift.rollout import carry
from qlift.rollout.evidence import VersionEvidence
from qlift.rollout.journal import Journal, Rollout, default_journal
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.states import Phase, State
from qlift.rollout.windows import bake_policy

Record = dict[str, Any]


def baseline(journal: Journal, rollout_id: int) -> tuple[VersionEvidence, str] | None:
    """The kept stable evidence and a note saying which window it is from; None when none was kept."""
    kept = journal.baseline(rollout_id)
    if kept is None:
        return None
    text, started, ended = kept
    ev = carry.load_version(text)
    when = f" ({started[11:19]}-{ended[11:19]})" if started and ended else ""
    note = (f"stable: its last window before 100%{when}, {ev.requests} requests; it serves nobody at 100%, so the "
            "bake judges the canary against those figures")
    return ev, note


# -- status ---------------------------------------------------------------------------------------------


class BakeStage(StrEnum):
    """Where a rollout's bake is, as `promote status` says it."""

    NOT_STARTED = "not started"
    NOT_REACHED = "not reached"
    BAKING = "baking"
    PAUSED = "paused"
    PASSED = "passed: the stable still runs until `qlift promote finish`"
    RELEASED = "passed, the stable released"
    FAILED = "failed: rolled back to the stable"
    SKIPPED = "skipped (promoted by hand)"
    ABORTED = "aborted"


@dataclass
class BakeStatus:
    required: int  # passing windows at 100% the bake needs (``--bake``)
    passed: int
    left: int  # passing windows still needed (0 once it passed or ended)
    phase: BakeStage
    judged: str  # how a bake window is judged, in words
    baseline: Record | None  # the stable's kept figures (its summary), None before the switch
    windows: list[Record]


STAGES = {State.BAKING: BakeStage.BAKING, State.BAKED: BakeStage.PASSED, State.FINISHED: BakeStage.RELEASED,
          State.ROLLED_BACK: BakeStage.FAILED, State.PROMOTED: BakeStage.SKIPPED, State.ABORTED: BakeStage.ABORTED,
          State.ABORT_REQUESTED: BakeStage.ABORTED}


def bake_status(journal: Journal, r: Rollout, spec: RolloutSpec, windows: list[Record]) -> BakeStatus | None:
    """The bake of rollout ``r`` (``windows``: its judged bake windows), None without ``--bake``."""
    policy = bake_policy(spec)
    if policy is None:
        return None
    kept = baseline(journal, r.id)
    passed = sum(1 for w in windows if Phase(w["action"]) in (Phase.PASS, Phase.ADVANCE))
    reached = bool(windows) or r.state in (State.BAKING, State.BAKED, State.FINISHED)
    if not reached:
        phase = BakeStage.NOT_REACHED if r.state.final else BakeStage.NOT_STARTED
    elif r.state == State.PAUSED:
        phase = BakeStage.PAUSED
    else:
        phase = STAGES.get(r.state, BakeStage.BAKING)
    left = max(0, policy.passes - passed) if r.state in (State.BAKING, State.PAUSED) or not reached else 0
    judged = (f"{policy.passes} passing {policy.interval_s:g}s window(s) at canary 100% on every check the steps "
              f"run, against {policy.against}")
    return BakeStatus(policy.passes, passed, left, phase, judged,
                      None if kept is None else {**kept[0].summary(), "note": kept[1]}, windows)


# -- `qlift promote finish` ---------------------------------------------------------------------------


def finish(journal_path: Path | None = None) -> Rollout:
    """Record the stable of a baked rollout released (``baked`` -> ``finished``); the weights stay 100% canary.
    Anything else is refused with one line saying what to do instead."""
    from qlift.rollout.aborts import spec_of
    from qlift.rollout.next_state import finished
    from qlift.rollout.persist import announce, commit

    path = Path(journal_path or default_journal())
    if not path.is_file():
        raise NotFoundError(f"no rollout journal at {path}", hint="Start one with `qlift promote start`.")
    with Journal(path) as journal:
        r = journal.latest()
        if r is None:
            raise NotFoundError(f"no rollout in {path}", hint="Start one with `qlift promote start`.")
        if r.state != State.BAKED:
            raise _not_baked(r)
        nxt = finished(r.stable, r.canary)
        if not commit(journal, r, nxt):
            raise QliftError(f"rollout {r.id} changed meanwhile ({journal.get(r.id).state})",
                             hint="See `qlift promote status`, then try again.")
        announce(spec_of(r).webhook, journal, r, nxt)
        return journal.get(r.id)


def _not_baked(r: Rollout) -> QliftError:
    if r.state == State.FINISHED:
        return QliftError(f"rollout {r.id} is already finished: its stable {r.stable} was released")
    if r.state in (State.BAKING, State.PAUSED) and r.spec.get("bake"):
        passes = r.passes if r.state == State.BAKING else 0
        return QliftError(f"rollout {r.id} is {r.state.value}: its bake has not passed yet "
                          f"({passes}/{r.spec['bake']} windows); the stable is not released before it has",
                          hint="Wait for it (`qlift promote status`), or `qlift promote promote` to skip the bake.")
    if r.state == State.PROMOTED:
        return QliftError(f"rollout {r.id} was promoted without a bake: there is no held stable to release",
                          hint="`promote finish` follows `qlift promote start --bake N`.")
    if r.state.final:
        return QliftError(f"rollout {r.id} is {r.state.value}: the stable {r.stable} serves every user, there is "
                          "nothing to finish")
    return QliftError(f"rollout {r.id} is {r.state.value}: only a baked rollout (`--bake N`, passed) is finished",
                      hint="See `qlift promote status`.")
