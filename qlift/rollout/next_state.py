"""What a rollout becomes next, as data: the analysis of a window (analysis.py) and every operator command
return a ``Next``, and ``commit`` (persist.py) writes it in one transaction, then ``announce`` tells the
webhook once. Nothing else writes a rollout's state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from qlift.rollout.check_types import CheckResult
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.shadow import ShadowEvidence
from qlift.rollout.states import DecisionAction, Phase, State, StepOutcome
from qlift.rollout.webhook import WebhookAction

Held = Evidence | ShadowEvidence
Carry = tuple[int, Held]  # the held evidence of a step (or of the shadow phase or bake, by their step index)


@dataclass(frozen=True)
class Counters:
    """The current step's windows: held in a row, passed, and without evidence in a row (None: as they are)."""

    holds: int | None = 0
    passes: int | None = 0
    errors: int | None = 0

    def fields(self) -> dict[str, int]:
        return {k: v for k, v in (("holds", self.holds), ("passes", self.passes), ("errors", self.errors))
                if v is not None}


@dataclass(frozen=True)
class StepMove:
    """The steps a decision ends and starts: ``finish`` the current one so; ``start`` (index, weight)."""

    finish: StepOutcome | None = None
    start: tuple[int, int] | None = None


@dataclass(frozen=True)
class JudgedWindow:
    """A judged window as the journal keeps it (``Journal.add_window``), under step index ``step``, and the
    analysis's held evidence after it (written in the same transaction, so a restarted controller judges on)."""

    step: int
    record: dict[str, Any]
    p_values: dict[str, float]
    carry: Carry | None
    checks: tuple[CheckResult, ...] = ()  # the judge's, as they came (the record keeps them as dicts)


@dataclass(frozen=True)
class Weights:
    """Weights journaled as an intent before the data plane is touched, with the decision that needs them."""

    canary: int  # the canary's percent
    reason: str


@dataclass(frozen=True)
class Next:
    """A rollout's next state and everything written with it.

    ``phase``: the judged window's action (None for a decision that judged no window); ``counters`` None: left
    as they are; ``decision``: a decision row without a window (start, an operator's command, a promotion);
    ``position``: the step index after it; ``baseline``: the stable's figures kept for the bake."""

    state: State
    reason: str
    phase: Phase | None = None
    counters: Counters | None = None
    window: JudgedWindow | None = None
    clear_carry: bool = False
    decision: DecisionAction | None = None
    manual: bool = False
    step: StepMove = field(default_factory=StepMove)
    position: int | None = None
    weights: Weights | None = None
    desired_version: str | None = None
    baseline: VersionEvidence | None = None
    webhook: WebhookAction | None = None
    webhook_step: int | None = None  # the step the webhook names (default: the rollout's before the move)
    spec: dict[str, Any] | None = None  # the rollout's new spec (JSON), where its options changed

    def naming_journal(self, path: Path | str) -> Next:
        """This decision with every `qlift promote CMD` its texts quote acting on the journal at ``path``
        (``journal.with_journal``), so a pause line works as printed."""
        from qlift.rollout.journal import with_journal

        window = self.window
        if window is not None and "reason" in window.record:
            window = replace(window, record={**window.record, "reason": with_journal(window.record["reason"], path)})
        return replace(self, reason=with_journal(self.reason, path), window=window)

    @property
    def p_values(self) -> dict[str, float]:
        return self.window.p_values if self.window is not None else {}

    @property
    def decision_reason(self) -> str | None:
        """A judged window's decision reason where it is not the record's: the reason of a state it moves to."""
        return self.reason if self.window is not None and self.phase in MOVES else None


MOVES = (Phase.ROLLBACK, Phase.PAUSE, Phase.ADVANCE)


# -- decisions that judge no window ------------------------------------------------------------------------


def promoted(stable: str, canary: str) -> Next:
    """The 100% step reached without a bake."""
    reason = f"canary {canary} at 100%: promoted"
    return Next(State.PROMOTED, reason, decision=DecisionAction.PROMOTED, step=StepMove(StepOutcome.PROMOTED),
                desired_version=canary, webhook=WebhookAction.PROMOTED)


def bake_started(stable: str, canary: str, windows: int) -> Next:
    reason = (f"canary {canary} at 100%: baking {windows} window(s) against the stable's last figures; "
              f"the stable {stable} keeps running at weight 0")
    return Next(State.BAKING, reason, counters=Counters(), clear_carry=True, decision=DecisionAction.BAKE,
                webhook=WebhookAction.BAKE)


def canary_changed(why: str) -> Next:
    """Paused, unjudged: the canary's model is not the one this rollout's evidence is about."""
    return Next(State.PAUSED, why, counters=Counters(), clear_carry=True, decision=DecisionAction.PAUSE,
                webhook=WebhookAction.PAUSE)


OPERATOR_PAUSE = "paused by an operator"
OPERATOR_RESUME = "resumed by an operator"


def operator_pause() -> Next:
    return Next(State.PAUSED, OPERATOR_PAUSE, counters=Counters(0, None, 0), decision=DecisionAction.PAUSE,
                manual=True)


def operator_resume(back: State) -> Next:
    return Next(back, OPERATOR_RESUME, counters=Counters(0, None, 0), decision=DecisionAction.RESUME, manual=True)


def options_changed(state: State, changes: Sequence[str], new_spec: dict[str, Any], *, resumed: bool = False) -> Next:
    """`start` on a rollout in progress with options that may change mid-rollout (options_change.py): its new
    spec, written with one decision naming each change. ``resumed``: a paused rollout goes back to ``state``
    with its holds counted afresh, as `resume` does."""
    reason = "options changed: " + ", ".join(changes) + ("; resumed" if resumed else "")
    return Next(state, reason, counters=Counters(0, None, 0) if resumed else None, decision=DecisionAction.OPTIONS,
                manual=True, spec=new_spec)


def operator_promote(canary: str, last_step: int) -> Next:
    reason = "manual promotion: remaining analysis skipped"
    return Next(State.PROMOTED, reason, decision=DecisionAction.PROMOTE, manual=True,
                step=StepMove(StepOutcome.PROMOTED), position=last_step, weights=Weights(100, reason),
                desired_version=canary, webhook=WebhookAction.PROMOTE)


def abort_requested(stable: str, reason: str) -> Next:
    return Next(State.ABORT_REQUESTED, reason, decision=DecisionAction.ABORT, manual=True,
                step=StepMove(StepOutcome.ABORTED), weights=Weights(0, reason), desired_version=stable)


def abort_confirmed() -> Next:
    return Next(State.ABORTED, "aborted by an operator: the data plane confirmed 100% stable")


def finished(stable: str, canary: str) -> Next:
    reason = f"the stable {stable} released by an operator: {canary} baked at 100% and serves every user"
    return Next(State.FINISHED, reason, decision=DecisionAction.FINISH, manual=True, webhook=WebhookAction.FINISH)
