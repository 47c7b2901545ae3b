"""Analysis of one step: what a judged window means for the rollout.

The judge (judge.py) says what one window's evidence shows. This object owns what the
rollout does with it, the policy Argo Rollouts keeps in its AnalysisRun: evidence of held
windows carried into the next one, passes needed per step (``intervals_per_step``), holds
tolerated (``max_inconclusive``), windows without evidence tolerated in a row
(``consecutive_error_limit``), the early stop on significant canary errors, and what too little
canary traffic does (pause by default, never a rollback unless asked). It returns a typed
``Phase``; the controller only acts on it.

Shadow windows (the canary answering mirrored copies of live prompts) go through the same
object and the same judge (judge.py, whose registry holds the checks of answer pairs too). A
window whose evidence source failed is measured ``Verdict.ERROR``: no evidence is no pass. It
holds, as Argo's AnalysisRun counts an errored measurement: toward ``consecutive_error_limit``
windows in a row (then a rollback), apart from the inconclusive holds, and any measured window
starts the count again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from qlift.rollout.check_types import Look
from qlift.rollout.evidence import Evidence, VersionEvidence, unique
from qlift.rollout.judge import Action, Decision, Verdict, early_failures, judge
from qlift.rollout.planes import SourceName
from qlift.rollout.shadow import ShadowEvidence, judge_window
from qlift.rollout.spec import AnalysisSpec, RolloutSpec
from qlift.rollout.states import Phase
from qlift.rollout.traffic import Cause, TrafficCounts, explain
from qlift.rollout.windows import BAKE_STEP, SHADOW_STEP, WindowPolicies

DOWN = "canary DOWN"  # how a canary the router keeps out of rotation is named, wherever it shows


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


@dataclass
class Assessment:
    phase: Phase
    reason: str  # the decision's (and a transition's) reason
    decision: Decision
    evidence: Evidence | ShadowEvidence
    holds: int  # the step's held windows after this one
    passes: int  # the step's passing windows after this one
    errors: int = 0  # windows in a row without evidence (its source failed), this one included

    def record(self) -> dict[str, Any]:
        """The window as the journal keeps it (``Journal.add_window``)."""
        d, ev = self.decision, self.evidence
        checks = [asdict(c) for c in d.checks]
        if isinstance(ev, ShadowEvidence):
            summary = ev.summary()
            return {"started_at": _iso(ev.started_at), "ended_at": _iso(ev.ended_at), "source": SourceName.SHADOW,
                    "stable": summary["stable"], "canary": summary["canary"], "action": self.phase,
                    "reason": d.reason, "checks": checks, "notes": [f"{summary['pairs']} shadow pairs"]}
        return {"started_at": _iso(ev.started_at), "ended_at": _iso(ev.ended_at), "source": ev.source,
                "stable": ev.stable.summary(), "canary": ev.canary.summary(), "action": self.phase,
                "reason": self.reason, "checks": checks,
                "notes": ev.notes + ([f"cumulative over {ev.windows} windows of this step"] if ev.windows > 1 else [])}


def on_insufficient(spec: RolloutSpec) -> Phase:
    """What too little canary traffic does after max_inconclusive windows: pause (default) or rollback."""
    return Phase(spec.analysis.on_insufficient)


def error_limit(a: AnalysisSpec) -> int:
    """Windows in a row without evidence tolerated: ``consecutive_error_limit``, else ``max_inconclusive``."""
    return a.max_inconclusive if a.consecutive_error_limit is None else a.consecutive_error_limit


def is_insufficient(d: Decision, ev: Evidence) -> bool:
    """The judge held only because the canary saw too few requests (not because a check was unsure, nor
    because the evidence source failed or counts no requests at all)."""
    return d.verdict == Verdict.INSUFFICIENT and ev.source != SourceName.NONE


def sizing_advice(ev: Evidence, spec: RolloutSpec, weight: int, *, rolled_back: bool = False) -> str:
    """Why the canary saw too few requests, from the router's counts (traffic.py), and what fixes that: a longer
    --interval (weight x requests/s x interval >= min_requests) only where too little traffic is the cause and
    the interval in use is shorter than the one needed. ``rolled_back`` (on_insufficient: rollback): the fix is
    applied by starting again, never by `resume`, which a rolled-back rollout refuses."""
    a = spec.analysis
    head = (f"too little canary traffic: {ev.canary.requests} canary requests in {ev.windows} window(s) of "
            f"{spec.interval:g}s at {weight}% (min_requests {a.min_requests})")
    seconds = max(ev.ended_at - ev.started_at, ev.windows * spec.interval, 1e-9)  # the step's windows, all of them
    counts = TrafficCounts.of(ev, share=weight / 100, window_s=seconds, min_requests=a.min_requests)
    cause = explain(counts)
    then = "start the rollout again" if rolled_back else "`qlift promote resume`"
    if cause.cause != Cause.VOLUME:
        return f"{head}: {cause.text}; then {then}"
    rule = (f"{head}; a window needs weight x requests/s x interval >= min_requests: at {counts.requests_per_s:.3g} "
            "requests/s")
    more = f"more than --max-inconclusive {a.max_inconclusive} windows; then {then}"
    need = cause.interval_needed  # set only where a longer window than the one in use is the fix (traffic.explain)
    if need is None:
        return f"{rule}, more traffic, a lower --min-requests, or {more}" + (" with them" if rolled_back else "")
    return (f"{rule}, {weight}% needs --interval >= {need}s, or a lower --min-requests, or {more}"
            + (" with them" if rolled_back else " (or start again with them)"))


Carry = tuple[int, Evidence | ShadowEvidence]


class Analysis:
    """The policy around the judges for one rollout; ``carry`` is the held evidence of the current step (or of
    the shadow phase, under SHADOW_STEP). ``on_carry`` is called with it whenever it changes, so the
    controller can journal it and a restarted controller judges with what the killed one had."""

    def __init__(self, spec: RolloutSpec, carry: Carry | None = None) -> None:
        self.spec = spec
        self.windows = WindowPolicies.of(spec)  # what a window of each kind needs
        self.carry: Carry | None = carry

    def reset(self) -> None:
        self.carry = None

    def with_carry(self, step: int, ev: Any) -> Any:
        held = self.carry[1] if self.carry is not None and self.carry[0] == step else None
        if isinstance(held, Evidence) and isinstance(ev, Evidence):
            return held.merged(ev)
        if isinstance(held, ShadowEvidence) and isinstance(ev, ShadowEvidence):
            return held.merged(ev)
        return ev

    def early_stop(self, step: int, peek: Evidence | None, look: Look) -> list[str]:
        """A failing canary need not wait for the window's end: once its errors are significant (the same test
        as the window's), or an answer check is at the level its looks spend, the window ends now and is judged
        in full. The names of the checks significant at this look."""
        if peek is None:
            return []
        ev = self.with_carry(step, peek)
        return [c.name for c in early_failures(ev, self.spec.analysis, look)]

    def assess(self, step: int, weight: int, window: Evidence, *, holds: int, passes: int, errors: int = 0
               ) -> Assessment:
        """One split window; ``holds``, ``passes`` and ``errors``: the journal's counts before it."""
        a, policy = self.spec.analysis, self.windows.step
        window.weight = weight  # the judge sizes windows by the planned share
        ev = self.with_carry(step, window)
        d = judge(ev, a)
        if d.verdict == Verdict.ERROR or (ev.canary.down is not None and d.action == Action.ADVANCE):
            return self._no_measurement(step, d, ev, holds, passes, errors + 1)  # never advance onto a DOWN canary
        if d.action == Action.ROLLBACK:
            self.carry = None
            down = f"{DOWN}: {ev.canary.down}; " if ev.canary.down is not None else ""
            return Assessment(Phase.ROLLBACK, down + d.reason, d, ev, holds, passes)
        if d.action == Action.ADVANCE:
            self.carry = None
            if passes + 1 < policy.passes:
                return Assessment(Phase.PASS, d.reason, d, ev, holds, passes + 1)
            return Assessment(Phase.ADVANCE, d.reason, d, ev, 0, 0)
        # held: inconclusive or too little traffic
        self.carry = (step, ev)
        if holds + 1 <= policy.max_holds:
            return Assessment(Phase.HOLD, d.reason, d, ev, holds + 1, passes)
        if is_insufficient(d, ev):
            rollback = on_insufficient(self.spec) == Phase.ROLLBACK
            advice = sizing_advice(ev, self.spec, weight, rolled_back=rollback)
            if rollback:
                self.carry = None
                return Assessment(Phase.ROLLBACK, f"{advice} (on_insufficient: rollback)", d, ev, holds + 1, passes)
            return Assessment(Phase.PAUSE, advice, d, ev, 0, passes)
        self.carry = None
        reason = f"inconclusive for {holds + 1} windows (max_inconclusive {a.max_inconclusive}): {d.reason}"
        return Assessment(Phase.ROLLBACK, reason, d, ev, holds + 1, passes)

    def _no_measurement(self, step: int, d: Decision, ev: Evidence | ShadowEvidence, holds: int, passes: int,
                        errors: int) -> Assessment:
        """A window whose evidence source failed: held (its held evidence carried on) up to
        ``consecutive_error_limit`` such windows in a row; one more rolls back, as Argo's Error phase aborts."""
        limit = error_limit(self.spec.analysis)
        down = ev.canary.down if isinstance(ev, Evidence) else None
        if errors <= limit:
            self.carry = (step, ev)
            if down is not None:  # the router's own word, in status, the page and the metrics
                return Assessment(Phase.HOLD, f"{DOWN}: {down} (held: {errors} window(s) in a row; rolls back after "
                                  f"consecutive_error_limit {limit})", d, ev, holds, passes, errors)
            return Assessment(Phase.HOLD, d.reason, d, ev, holds, passes, errors)
        self.carry = None
        if down is not None:
            return Assessment(Phase.ROLLBACK, f"{DOWN}: {down}: out of rotation for {errors} windows in a row "
                              f"(consecutive_error_limit {limit})", d, ev, holds, passes, errors)
        phase = "shadow phase: " if step == SHADOW_STEP else ""
        reason = (f"{phase}no evidence for {errors} windows in a row (consecutive_error_limit {limit}): the evidence "
                  f"source failed: {ev.error}")
        return Assessment(Phase.ROLLBACK, reason, d, ev, holds, passes, errors)

    def assess_shadow(self, window: ShadowEvidence, *, holds: int, passes: int, errors: int = 0) -> Assessment:
        """One shadow window: the judge model's verdicts on its pairs (bounded by shadow.judge_deadline_s), the
        held windows' pairs added up (as a step's held evidence is), then the same policy: a failing check rolls
        back; a pass advances once ``shadow.windows`` windows passed; a hold holds up to max_inconclusive
        windows, then pauses (or rolls back, with on_insufficient rollback). A window whose pairs could not be
        read counts toward consecutive_error_limit, as a split window's failed evidence source does."""
        shadow, policy = self.spec.shadow, self.windows.shadow
        assert shadow is not None and policy is not None
        window.judged = judge_window(window, shadow)
        ev = self.with_carry(SHADOW_STEP, window)
        d = judge(ev, self.spec.analysis, shadow)
        if d.verdict == Verdict.ERROR:
            return self._no_measurement(SHADOW_STEP, d, ev, holds, passes, errors + 1)
        self.carry = (SHADOW_STEP, ev) if d.action == Action.HOLD else None
        if d.action == Action.ROLLBACK:
            return Assessment(Phase.ROLLBACK, f"shadow phase: {d.reason}", d, ev, holds, passes)
        if d.action == Action.ADVANCE:
            if passes + 1 >= policy.passes:
                return Assessment(Phase.ADVANCE, f"shadow phase passed ({policy.passes} windows): {d.reason}", d, ev,
                                  0, 0)
            # a passing window's held windows are spent: the next one gets max_inconclusive holds of its own
            return Assessment(Phase.PASS, d.reason, d, ev, 0, passes + 1)
        if holds + 1 <= policy.max_holds:
            return Assessment(Phase.HOLD, d.reason, d, ev, holds + 1, passes)
        reason = (f"shadow phase inconclusive for {holds + 1} windows: {d.reason}; mirror a larger share "
                  f"(--shadow), or a longer --interval, or raise --max-inconclusive")
        return Assessment(on_insufficient(self.spec), reason, d, ev, 0, passes)

    # -- the bake after 100% (RolloutSpec.bake) ---------------------------------------------

    def bake_evidence(self, window: Evidence, baseline: VersionEvidence, note: str) -> Evidence:
        """A bake window's canary (its held windows' added up) against ``baseline``, the stable's evidence from its
        last window before 100%: at 100% the stable serves nobody, so its figures are the kept ones, never added up."""
        held = self.carry[1] if self.carry is not None and self.carry[0] == BAKE_STEP else None
        ev = held.merged(window) if isinstance(held, Evidence) else window
        ev.stable = baseline
        ev.notes = unique([*ev.notes, note])
        return ev

    def early_stop_bake(self, peek: Evidence | None, baseline: VersionEvidence, note: str, look: Look) -> list[str]:
        if peek is None:
            return []
        return [c.name for c in early_failures(self.bake_evidence(peek, baseline, note), self.spec.analysis, look)]

    def assess_bake(self, window: Evidence, baseline: VersionEvidence, note: str, *, holds: int, passes: int,
                    errors: int = 0) -> Assessment:
        """One bake window, judged as a step's (the same checks, holds, pauses and rollbacks) against the kept
        stable figures; the bake passes (ADVANCE) once ``spec.bake`` windows passed."""
        ev = self.bake_evidence(window, baseline, note)
        self.carry = None  # added up above: ``assess`` must not add the held windows again
        v = self.assess(BAKE_STEP, 100, ev, holds=holds, passes=passes, errors=errors)
        if v.phase not in (Phase.PASS, Phase.ADVANCE):
            return v
        assert self.windows.bake is not None
        done, needed = passes + 1, self.windows.bake.passes
        if done < needed:
            return Assessment(Phase.PASS, f"bake window {done}/{needed} passed: {v.reason}", v.decision, v.evidence,
                              holds, done)
        return Assessment(Phase.ADVANCE, f"bake passed ({needed} window(s) at 100%): {v.reason}", v.decision,
                          v.evidence, 0, 0)
