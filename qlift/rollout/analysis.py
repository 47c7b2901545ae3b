"""Analysis of one step: what a judged window means for the rollout.

The judge (judge.py) says what one window's evidence shows. This object owns what the
rollout does with it, the policy Argo Rollouts keeps in its AnalysisRun: evidence of held
windows carried into the next one, passes needed per step (``intervals_per_step``), holds
tolerated (``max_inconclusive``), the early stop on significant canary errors, and what too
little canary traffic does (pause by default, never a rollback unless asked). It returns a
typed ``Phase``; the controller only acts on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from qlift.rollout.evidence import Evidence
from qlift.rollout.judge import Decision, early_failures, judge
from qlift.rollout.spec import RolloutSpec


class Phase(StrEnum):
    ADVANCE = "advance"  # the step passed: the next step's weights
    PASS = "pass"  # this window passed; the step needs more passing windows
    HOLD = "hold"  # inconclusive: the evidence is carried into the next window
    ROLLBACK = "rollback"  # a check failed, or analysis stayed inconclusive for too long
    PAUSE = "pause"  # too little canary traffic for too long: wait for an operator


@dataclass
class Assessment:
    phase: Phase
    reason: str
    decision: Decision
    evidence: Evidence
    holds: int  # the step's held windows after this one
    passes: int  # the step's passing windows after this one


def on_insufficient(spec: RolloutSpec) -> str:
    """What too little canary traffic does after max_inconclusive windows: pause (default) or rollback."""
    return spec.analysis.on_insufficient


def is_insufficient(d: Decision, ev: Evidence) -> bool:
    """The judge held only because the canary saw too few requests (not because a check was unsure)."""
    if ev.source == "none":  # the evidence source failed: an outage, not a quiet canary
        return False
    return d.insufficient


def sizing_advice(ev: Evidence, spec: RolloutSpec, weight: int) -> str:
    """How to size the window: weight x requests/s x interval >= min_requests, naming the flags."""
    a = spec.analysis
    seconds = max(ev.ended_at - ev.started_at, 1e-9)
    rps = (ev.stable.requests + ev.canary.requests) / seconds
    head = (f"too little canary traffic: {ev.canary.requests} canary requests in {ev.windows} window(s) of "
            f"{spec.interval:g}s at {weight}% (min_requests {a.min_requests}); a window needs weight x requests/s "
            f"x interval >= min_requests")
    if rps <= 0 or weight <= 0:
        return head + ": no requests reached the data plane; send traffic, then `qlift promote resume`"
    need = math.ceil(a.min_requests / (weight / 100 * rps))
    return (f"{head}: at {rps:.3g} requests/s, {weight}% needs --interval >= {need}s, or a lower --min-requests, or "
            f"more than --max-inconclusive {a.max_inconclusive} windows; then `qlift promote resume` (or start "
            f"again with them)")


class Analysis:
    """The policy around the judge for one rollout; ``carry`` is the current step's held evidence."""

    def __init__(self, spec: RolloutSpec) -> None:
        self.spec = spec
        self.carry: tuple[int, Evidence] | None = None

    def reset(self) -> None:
        self.carry = None

    def with_carry(self, step: int, ev: Evidence) -> Evidence:
        if self.carry is not None and self.carry[0] == step:
            return self.carry[1].merged(ev)
        return ev

    def early_stop(self, step: int, peek: Evidence | None) -> bool:
        """A failing canary need not wait for the window's end: once its errors are significant
        (the same test as the window's), the window ends now and is judged in full."""
        if peek is None:
            return False
        ev = self.with_carry(step, peek)
        return bool(early_failures(ev, self.spec.analysis))

    def assess(self, step: int, weight: int, window: Evidence, *, holds: int, passes: int) -> Assessment:
        a = self.spec.analysis
        window.weight = weight  # the judge sizes windows by the planned share
        ev = self.with_carry(step, window)
        d = judge(ev, a)
        if d.action == "rollback":
            self.carry = None
            return Assessment(Phase.ROLLBACK, d.reason, d, ev, holds, passes)
        if d.action == "advance":
            self.carry = None
            if passes + 1 < a.intervals_per_step:
                return Assessment(Phase.PASS, d.reason, d, ev, holds, passes + 1)
            return Assessment(Phase.ADVANCE, d.reason, d, ev, 0, 0)
        # held: inconclusive, or too little traffic
        self.carry = (step, ev)
        if holds + 1 <= a.max_inconclusive:
            return Assessment(Phase.HOLD, d.reason, d, ev, holds + 1, passes)
        if is_insufficient(d, ev):
            advice = sizing_advice(ev, self.spec, weight)
            if on_insufficient(self.spec) == "rollback":
                self.carry = None
                return Assessment(Phase.ROLLBACK, f"{advice} (on_insufficient: rollback)", d, ev, holds + 1, passes)
            return Assessment(Phase.PAUSE, advice, d, ev, 0, passes)
        self.carry = None
        reason = f"inconclusive for {holds + 1} windows (max_inconclusive {a.max_inconclusive}): {d.reason}"
        return Assessment(Phase.ROLLBACK, reason, d, ev, holds + 1, passes)


def shadow_phase(action: str, spec: RolloutSpec, *, holds: int, passes: int) -> Phase:
    """What one judged shadow window does: the judge's rollback rolls back; a pass advances once
    ``shadow.windows`` windows passed; a hold holds up to max_inconclusive windows, then pauses (or rolls
    back, with on_insufficient rollback)."""
    if action == "rollback":
        return Phase.ROLLBACK
    if action == "advance":
        assert spec.shadow is not None
        return Phase.ADVANCE if passes + 1 >= spec.shadow.windows else Phase.PASS
    if holds + 1 <= spec.analysis.max_inconclusive:
        return Phase.HOLD
    return Phase.ROLLBACK if on_insufficient(spec) == "rollback" else Phase.PAUSE


def shadow_summary(ev: Any) -> dict[str, Any]:
    """What the journal keeps of one shadow window's evidence, whatever its type offers."""
    from dataclasses import asdict, is_dataclass

    for name in ("summary", "model_dump"):
        fn = getattr(ev, name, None)
        if callable(fn):
            out = fn()
            if isinstance(out, dict):
                return out
    if is_dataclass(ev) and not isinstance(ev, type):
        return asdict(ev)
    return {}
