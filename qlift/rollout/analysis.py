"""Analysis of one step: what a judged window means for the rollout.

The judge (judge.py) says what one window's evidence shows. This object owns what the
rollout does with it, the policy Argo Rollouts keeps in its AnalysisRun: evidence of held
windows carried into the next one, passes needed per step (``intervals_per_step``), holds
tolerated (``max_inconclusive``), windows without evidence tolerated in a row
(``consecutive_error_limit``), the early stop on significant canary errors, and what too little
canary traffic does (pause by default, never a rollback unless asked). It returns the rollout's
``Next`` (next_state.py) as data; the controller only persists it (persist.py). Where the kinds of window
(a step's, the shadow phase's, the bake's) differ, a named ``WindowPolicy`` field (windows.py) says how.

Shadow windows (the canary answering mirrored copies of live prompts) go through the same
object and the same judge (judge.py, whose registry holds the checks of answer pairs too). A
window whose evidence source failed is measured ``Verdict.ERROR``: no evidence is no pass. It
holds, as Argo's AnalysisRun counts an errored measurement: toward ``consecutive_error_limit``
windows in a row (then a rollback), apart from the inconclusive holds, and any measured window
starts the count again.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from qlift.rollout.check_types import Look
from qlift.rollout.evidence import Evidence, unique
from qlift.rollout.journal import Rollout
from qlift.rollout.judge import Action, Decision, Verdict, early_failures, judge
from qlift.rollout.next_state import Carry, Counters, Held, JudgedWindow, Next, StepMove, Weights
from qlift.rollout.planes import SourceName
from qlift.rollout.shadow import ShadowEvidence
from qlift.rollout.spec import AnalysisSpec, RolloutSpec
from qlift.rollout.states import Phase, State, StepOutcome
from qlift.rollout.traffic import Cause, TrafficCounts, back_in_rotation, explain
from qlift.rollout.webhook import WebhookAction
from qlift.rollout.windows import BAKE_STEP, SHADOW_STEP, WindowPolicies, WindowPolicy, WindowRole

__all__ = ["BAKE_STEP", "DOWN", "SHADOW_STEP", "Analysis", "WindowState", "error_limit", "record", "sizing_advice"]

DOWN = "canary DOWN"  # how a canary the router keeps out of rotation is named, wherever it shows


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def record(phase: Phase, reason: str, d: Decision, ev: Held) -> dict[str, Any]:
    """The window as the journal keeps it (``Journal.add_window``)."""
    checks = [asdict(c) for c in d.checks]
    if isinstance(ev, ShadowEvidence):
        summary = ev.summary()
        return {"started_at": _iso(ev.started_at), "ended_at": _iso(ev.ended_at), "source": SourceName.SHADOW,
                "stable": summary["stable"], "canary": summary["canary"], "action": phase,
                "reason": d.reason, "checks": checks, "notes": [f"{summary['pairs']} shadow pairs"]}
    return {"started_at": _iso(ev.started_at), "ended_at": _iso(ev.ended_at), "source": ev.source,
            "stable": ev.stable.summary(), "canary": ev.canary.summary(), "action": phase,
            "reason": reason, "checks": checks,
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
    back = back_in_rotation(counts)
    rule = (f"{head}; {back + '; ' if back else ''}a window needs weight x requests/s x interval >= min_requests: at "
            f"{counts.requests_per_s:.3g} requests/s")
    more = f"more than --max-inconclusive {a.max_inconclusive} windows; then {then}"
    need = cause.interval_needed  # set only where a longer window than the one in use is the fix (traffic.explain)
    if need is None:
        return f"{rule}, more traffic, a lower --min-requests, or {more}" + (" with them" if rolled_back else "")
    return (f"{rule}, {weight}% needs --interval >= {need}s, or a lower --min-requests, or {more}"
            + (" with them" if rolled_back else " (or start again with them)"))


@dataclass(frozen=True)
class WindowState:
    """Where the rollout stands as a window ends: its journaled row and the held evidence it judges on."""

    rollout: Rollout
    carry: Carry | None = None


def window_step(policy: WindowPolicy, r: Rollout) -> int:
    """The step index a window of ``policy`` is journaled (and its evidence carried) under."""
    return r.step if policy.journal_step is None else policy.journal_step


def planned_weight(policy: WindowPolicy, r: Rollout) -> int:
    return {WindowRole.SHADOW: 0, WindowRole.BAKE: 100}.get(policy.role, r.steps[r.step])


class Analysis:
    """The policy around the judge for one rollout: ``assess`` turns a window's evidence into the rollout's
    ``Next`` (next_state.py), as data; the controller only persists it."""

    def __init__(self, spec: RolloutSpec) -> None:
        self.spec = spec
        self.windows = WindowPolicies.of(spec)  # what a window of each kind needs

    def with_carry(self, policy: WindowPolicy, at: WindowState, ev: Held) -> Held:
        """``ev`` added up with the held evidence of its step; a kept stable (the bake's) is never added up."""
        held = at.carry[1] if at.carry is not None and at.carry[0] == window_step(policy, at.rollout) else None
        if isinstance(held, Evidence) and isinstance(ev, Evidence):
            merged = held.merged(ev)
            if policy.kept_stable:
                merged.stable = ev.stable
                merged.notes = unique(merged.notes)
            return merged
        if isinstance(held, ShadowEvidence) and isinstance(ev, ShadowEvidence):
            return held.merged(ev)
        return ev

    def early_stop(self, policy: WindowPolicy, at: WindowState, peek: Evidence | None, look: Look) -> list[str]:
        """A failing canary need not wait for the window's end: once its errors are significant (the same test
        as the window's), or an answer check is at the level its looks spend, the window ends now and is judged
        in full. The names of the checks significant at this look."""
        if peek is None:
            return []
        ev = self.with_carry(policy, at, peek)
        assert isinstance(ev, Evidence)
        return [c.name for c in early_failures(ev, self.spec.analysis, look)]

    def assess(self, policy: WindowPolicy, evidence: Held, window: WindowState) -> Next:
        """One judged window of ``policy``'s kind: what the rollout becomes next. A failing check rolls back; a
        pass counts toward ``policy.passes`` passing windows, then the rollout moves on; a hold carries the
        evidence into the next window, up to ``policy.max_holds``; a window without evidence counts toward
        consecutive_error_limit; a canary the router keeps out of rotation is never advanced onto."""
        r = window.rollout
        if isinstance(evidence, Evidence):
            evidence.weight = planned_weight(policy, r)  # the judge sizes windows by the planned share
        ev = self.with_carry(policy, window, evidence)
        d = judge(ev, self.spec.analysis, self.spec.shadow if isinstance(ev, ShadowEvidence) else None)
        down = ev.canary.down if isinstance(ev, Evidence) else None
        if d.verdict == Verdict.ERROR or (down is not None and d.action == Action.ADVANCE):
            return self._no_measurement(policy, r, d, ev, down)
        if d.action == Action.ROLLBACK:
            prefix = policy.reason_prefix + (f"{DOWN}: {down}; " if down is not None else "")
            return self._rollback(policy, r, prefix + d.reason, d, ev)
        if d.action == Action.ADVANCE:
            done = r.passes + 1
            if done < policy.passes:
                reason = policy.pass_text.format(done=done, needed=policy.passes, reason=d.reason)
                holds = 0 if policy.pass_resets_holds else r.holds
                return self._judged(policy, r, Phase.PASS, reason, d, ev, Counters(holds, done, 0), None)
            return self._passed(policy, r, policy.passed_text.format(needed=policy.passes, reason=d.reason), d, ev)
        held = (window_step(policy, r), ev)
        if r.holds + 1 <= policy.max_holds:
            return self._judged(policy, r, Phase.HOLD, d.reason, d, ev, Counters(r.holds + 1, r.passes, 0), held)
        if policy.exhausted_holds_follow_on_insufficient:
            reason = (f"shadow phase inconclusive for {r.holds + 1} windows: {d.reason}; mirror a larger share "
                      f"(--shadow), or a longer --interval, or raise --max-inconclusive{self._start_with_more()}")
            if on_insufficient(self.spec) == Phase.ROLLBACK:
                return self._rollback(policy, r, reason, d, ev)
            return self._paused(policy, r, reason, d, ev, held)
        if isinstance(ev, Evidence) and is_insufficient(d, ev):
            rollback = on_insufficient(self.spec) == Phase.ROLLBACK
            advice = sizing_advice(ev, self.spec, planned_weight(policy, r), rolled_back=rollback)
            if rollback:
                return self._rollback(policy, r, f"{advice} (on_insufficient: rollback)", d, ev)
            return self._paused(policy, r, advice, d, ev, held)
        reason = f"inconclusive for {r.holds + 1} windows (max_inconclusive {self.spec.analysis.max_inconclusive}): " \
                 f"{d.reason}"
        return self._rollback(policy, r, reason, d, ev)

    def _start_with_more(self) -> str:
        """A `start` line that applies a larger shadow share (or more holds) to this rollout and resumes it
        (options_change.py); the journal's flag is added where the decision is committed."""
        shadow, spec = self.spec.shadow, self.spec
        if shadow is None or not spec.router:
            return ""
        more = f"--shadow {min(100, shadow.percent * 2)}%" if shadow.percent < 100 else \
            f"--max-inconclusive {spec.analysis.max_inconclusive * 2 + 1}"
        return (f"; `qlift promote start --router {shlex.quote(spec.router)} --stable {shlex.quote(spec.stable)} "
                f"--canary {shlex.quote(spec.canary)} {more}` applies it and resumes, `qlift promote resume` "
                "goes on as it is")

    def _no_measurement(self, policy: WindowPolicy, r: Rollout, d: Decision, ev: Held, down: str | None) -> Next:
        """A window whose evidence source failed: held (its held evidence carried on) up to
        ``consecutive_error_limit`` such windows in a row; one more rolls back, as Argo's Error phase aborts."""
        errors, limit = r.errors + 1, error_limit(self.spec.analysis)
        if errors <= limit:
            reason = d.reason if down is None else (f"{DOWN}: {down} (held: {errors} window(s) in a row; rolls back "
                                                    f"after consecutive_error_limit {limit})")
            return self._judged(policy, r, Phase.HOLD, reason, d, ev, Counters(r.holds, r.passes, errors),
                                (window_step(policy, r), ev))
        if down is not None:
            reason = (f"{DOWN}: {down}: out of rotation for {errors} windows in a row (consecutive_error_limit "
                      f"{limit})")
        else:
            reason = (f"{policy.reason_prefix}no evidence for {errors} windows in a row (consecutive_error_limit "
                      f"{limit}): the evidence source failed: {ev.error}")
        return self._rollback(policy, r, reason, d, ev, errors)

    def _judged(self, policy: WindowPolicy, r: Rollout, phase: Phase, reason: str, d: Decision, ev: Held,
                counters: Counters | None, held: Carry | None, **more: Any) -> Next:
        window = JudgedWindow(window_step(policy, r), record(phase, reason, d, ev), d.p_values, held, tuple(d.checks))
        return Next(more.pop("state", r.state), reason, phase, counters, window, webhook=WebhookAction(phase), **more)

    def _rollback(self, policy: WindowPolicy, r: Rollout, reason: str, d: Decision, ev: Held,
                  errors: int = 0) -> Next:
        return self._judged(policy, r, Phase.ROLLBACK, reason, d, ev, Counters(None, None, errors), None,
                            state=State.ROLLED_BACK, step=StepMove(StepOutcome.ROLLED_BACK),
                            weights=Weights(0, "rollback"), desired_version=r.stable)

    def _paused(self, policy: WindowPolicy, r: Rollout, reason: str, d: Decision, ev: Held, held: Carry) -> Next:
        return self._judged(policy, r, Phase.PAUSE, reason, d, ev, Counters(0, None, 0), held, state=State.PAUSED)

    def _passed(self, policy: WindowPolicy, r: Rollout, reason: str, d: Decision, ev: Held) -> Next:
        """The step, the shadow phase or the bake passed: the next step's weights, or the policy's next state."""
        more: dict[str, Any] = {"state": policy.passed_state, "step": StepMove(policy.finish_on_pass)}
        if policy.passed_state == State.BAKED:
            more["desired_version"] = r.canary
        if policy.next_step_on_pass:
            nxt, weight = r.step + 1, r.steps[r.step + 1]
            more.update(step=StepMove(policy.finish_on_pass, (nxt, weight)), position=nxt, webhook_step=nxt,
                        weights=Weights(weight, f"step {nxt + 1}/{len(r.steps)}: canary {weight}%"))
            if weight == 100 and self.spec.bake and isinstance(ev, Evidence):
                more["baseline"] = ev.stable
        nxt_state = self._judged(policy, r, Phase.ADVANCE, reason, d, ev, Counters(), None, **more)
        return replace(nxt_state, webhook=policy.webhook_on_pass)
