"""The window machinery every phase of the controller (controller.py) shares: watching one window, voiding
it where the weights drifted or the rollout moved on, pausing where the canary's model changed, and journaling
what the analysis decided (hold, pass, pause, rollback) before the webhook is told. The split steps live in
controller.py; the shadow phase in shadow_phase.py; the bake windows in bake_phase.py. Each window kind's rules
(interval, early end, what it counts) come from its ``WindowPolicy`` (windows.py).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qlift.errors import QliftError
from qlift.rollout import carry
from qlift.rollout.analysis import Analysis, Assessment
from qlift.rollout.check_types import Look
from qlift.rollout.dataplane import DataPlane, mirror_source
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.identity import canary_changed
from qlift.rollout.journal import Journal, Rollout, now_iso
from qlift.rollout.planes import SourceName
from qlift.rollout.reconcile import Drift, Reconciler
from qlift.rollout.shadow import ShadowSource
from qlift.rollout.sources import Collector
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.states import RUNNING, DecisionAction, EventKind, Phase, State, StepOutcome
from qlift.rollout.webhook import WebhookAction, notify
from qlift.rollout.windows import WindowPolicy

log = logging.getLogger("qlift.rollout.controller")  # one logger for the whole controller, as before the split

EARLY_CHECK_S = 1.0  # how often a window in progress peeks at the evidence and re-reads the weights
# A look at a window in progress -> the checks already significant there (none: the window goes on).
Peek = Callable[[Look], list[str]]
RETRY_MAX_S = 2.0  # longest wait between attempts to reach an unreachable data plane


@dataclass(frozen=True)
class Pace:
    """The controller's time: how often it ticks, how it sleeps, what the clock says (tests pass a fake clock
    whose sleep moves it, and drive whole rollouts in a blink)."""

    tick: float = 0.25
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.time


@dataclass(frozen=True)
class Void:
    """Why a window is not judged; ``interrupted``: the rollout moved on (an operator's command), not journaled."""

    reason: str
    interrupted: bool = False



class WindowLoop:
    """The controller's state and its window machinery; ``Controller`` (controller.py) runs the loop."""

    def __init__(self, journal: Journal, rollout_id: int, spec: RolloutSpec, plane: DataPlane,
                 collector: Collector, *, pace: Pace | None = None, shadow_source: ShadowSource | None = None) -> None:
        self.journal, self.rid, self.spec, self.plane, self.collector = journal, rollout_id, spec, plane, collector
        pace = pace or Pace()
        self.tick = pace.tick
        self.sleep = pace.sleep
        self.clock = pace.clock
        held = journal.carry(rollout_id)  # a killed controller's held evidence: judged on with the next window
        self.analysis = Analysis(spec, None if held is None else (held[0], carry.load(held[1], held[2])))
        self.shadow_source = mirror_source(plane, spec) if shadow_source is None else shadow_source
        self.reconciler = Reconciler(journal, rollout_id, plane)
        self.webhook_failures = 0
        self._retry_s = pace.tick

    @property
    def drifts(self) -> int:
        return self.reconciler.drifts


    def _back_off(self) -> None:
        self.journal.heartbeat()
        self.sleep(self._retry_s)
        self._retry_s = min(RETRY_MAX_S, self._retry_s * 2)


    def recover(self) -> None:
        """Re-apply weights journaled but never applied; restore the journal's weights if the plane drifted."""
        try:
            pending = self.journal.reapply_pending(self.rid, self.plane.set_weights)
            if pending is not None:
                log.info("re-applied journaled weights %s (%s)", pending.weights, pending.reason)
            self.reconciler.reconcile()
        except QliftError as exc:
            log.warning("could not converge the data plane yet: %s", exc.one_line())

    def _ensure_weights(self, r: Rollout, want: dict[str, int], reason: str, *, start_step: int | None) -> bool:
        last = self.journal.last_change(self.rid)
        if last is not None and last.weights == want:
            if last.applied_at is None:  # journaled, but the plane was down: apply it now
                self.journal.reapply_pending(self.rid, self.plane.set_weights)
            return True
        log.info("%s -> weights %s", reason, want)
        also = None
        if start_step is not None:
            def also(db: Any) -> None:
                self.journal.start_step(db, self.rid, r.step, start_step)
        return self.journal.change_weights(self.rid, want, reason, self.plane.set_weights,
                                           allowed_states=tuple(RUNNING), also=also)

    # -- one window ------------------------------------------------------------------

    def _drifted(self) -> Void | None:
        """Why the window is void because the plane's weights drifted (or cannot be read), else None."""
        try:
            if self.reconciler.reconcile():
                return Void("the data plane's weights drifted during the window (re-applied)")
        except Drift as exc:
            return Void(str(exc))
        return None

    def _watch(self, r: Rollout, policy: WindowPolicy, begin: Callable[[], None], peek: Peek
               ) -> tuple[Void | None, str, str | None]:
        """Wait one interval of ``policy``'s (``peek`` ends it early where the policy allows). Returns (why the
        window is void or None, a note, why the evidence source failed or None). A void window is not judged."""
        self.reconciler.reconcile()  # an unreachable plane raises Drift: the run loop backs off, comes back here
        failure = None
        try:
            begin()
        except QliftError as exc:
            failure = exc.one_line()
        started = self.clock()
        deadline = started + policy.interval_s
        next_check = started + EARLY_CHECK_S
        looked = 0.0  # the share of the interval gone at the last look
        while (left := deadline - self.clock()) > 0:
            self.sleep(min(self.tick, left))
            self.journal.heartbeat()
            state, step = self.journal.position(self.rid)
            if state != r.state or step != r.step or self.journal.abort_marker.exists():
                return Void(f"window interrupted: rollout is {state}", interrupted=True), "", None
            if self.clock() >= next_check:
                next_check = self.clock() + EARLY_CHECK_S
                if (why := self._drifted()) is not None:
                    return why, "", None
                if failure is None and policy.early_end:
                    now = min(1.0, (self.clock() - started) / policy.interval_s)
                    significant, looked = peek(Look(looked, now)), now
                    if significant:
                        return None, f"ended early after {self.clock() - started:.1f}s: {', '.join(significant)} " \
                                     "already significant", None
        return self._drifted(), "", failure

    def _split_evidence(self, r: Rollout, policy: WindowPolicy, begin: Callable[[], None],
                        peek: Peek) -> Evidence | None:
        """Watch one split window (a step's or the bake's) and collect its evidence; a failed source gives a
        window of no evidence. None: nothing to judge (the window was void, or the canary's model changed)."""
        void, note, failure = self._watch(r, policy, begin, peek)
        if void is not None:
            self._discard(r, void)
            return None
        if self._canary_changed(r):
            return None
        if failure is not None:
            return self._no_evidence(r, failure)
        try:
            ev = self.collector.collect()
        except QliftError as exc:
            return self._no_evidence(r, exc.one_line())
        ev.notes += [note] if note else []
        return ev

    def _canary_changed(self, r: Rollout) -> bool:
        """Pause, unjudged, when the canary's model is not the one this rollout's evidence is about."""
        why = canary_changed(self.journal, self.rid, self.plane, r.canary)
        if why is None:
            return False
        self.analysis.reset()  # never judge the new model on the old one's evidence
        with self.journal.tx() as db:
            if not self.journal.transition(db, self.rid, r.state, State.PAUSED, why, holds=0, passes=0, errors=0):
                return True
            self.journal.set_carry(db, self.rid, None)
            self.journal.decide(db, self.rid, r.step, DecisionAction.PAUSE, why)
        log.warning("paused: %s", why)
        self._notify(r, WebhookAction.PAUSE, why, {}, state=State.PAUSED)
        return True

    def _no_evidence(self, r: Rollout, failure: str) -> Evidence:
        # No evidence is no pass: the window holds (and counts toward consecutive_error_limit).
        note = f"evidence source failed: {failure}"
        log.warning("no evidence this window: %s", note)
        now = self.clock()
        return Evidence(VersionEvidence(r.stable), VersionEvidence(r.canary), now - self.spec.interval, now,
                        SourceName.NONE, notes=[note], error=failure)

    def _discard(self, r: Rollout, void: Void) -> None:
        log.warning("window discarded: %s", void.reason)
        if not void.interrupted:
            self.journal.log_event(self.rid, EventKind.WINDOW_DISCARDED, {"step": r.step, "state": r.state,
                                                                           "reason": void.reason})


    # -- decisions -------------------------------------------------------------------

    def _act(self, r: Rollout, v: Assessment, *, step: int | None = None) -> None:
        """What the analysis decided, journaled (``step``: SHADOW_STEP for a shadow window)."""
        idx = r.step if step is None else step
        if v.phase == Phase.ROLLBACK:
            self._rollback(r, v, idx)
        elif v.phase == Phase.ADVANCE:
            self._moved_on(r, v, step)
        elif v.phase == Phase.PAUSE:
            self._pause(r, v, idx)
        else:
            self._record(r, v, idx)

    def _record(self, r: Rollout, v: Assessment, idx: int) -> None:
        with self.journal.tx() as db:
            if self.journal.get(self.rid).state != r.state:
                return
            self._journal_window(db, idx, v)
            self.journal.update(db, self.rid, holds=v.holds, passes=v.passes, errors=v.errors)
        self._notify(r, WebhookAction(v.phase), v.reason, v.decision.p_values)

    def _journal_window(self, db: sqlite3.Connection, idx: int, v: Assessment, *, reason: str | None = None) -> None:
        """The judged window, its decision and the analysis's held evidence, in ``db``'s transaction."""
        self.journal.judged(db, self.rid, idx, v.record(), v.decision.p_values, reason=reason)
        held = self.analysis.carry
        self.journal.set_carry(db, self.rid, None if held is None else (held[0], *carry.dump(held[1])))

    def _pause(self, r: Rollout, v: Assessment, idx: int) -> None:
        with self.journal.tx() as db:
            if not self.journal.transition(db, self.rid, r.state, State.PAUSED, v.reason, holds=0, errors=0):
                return
            self._journal_window(db, idx, v, reason=v.reason)
        log.warning("paused: %s", v.reason)
        self._notify(r, WebhookAction.PAUSE, v.reason, v.decision.p_values, state=State.PAUSED)

    def _moved_on(self, r: Rollout, v: Assessment, step: int | None) -> None:
        """A passed step (``step`` None) or shadow phase: the controller moves to what comes next."""
        raise NotImplementedError

    def _rollback(self, r: Rollout, v: Assessment, idx: int) -> None:
        def also(db: Any) -> None:
            self._journal_window(db, idx, v, reason=v.reason)
            self.journal.finish_step(db, self.rid, r.step, StepOutcome.ROLLED_BACK)
            self.journal.transition(db, self.rid, r.state, State.ROLLED_BACK, v.reason, desired_version=r.stable,
                                    errors=v.errors)

        # The state is final from here; if the plane refuses the weights, _converge_final retries until applied.
        if self.journal.change_weights(self.rid, r.weights_for(0), "rollback", self.plane.set_weights,
                                       allowed_states=(r.state,), also=also):
            log.warning("rolled back: %s", v.reason)
            self._notify(r, WebhookAction.ROLLBACK, v.reason, v.decision.p_values, state=State.ROLLED_BACK)


    # -- notifications ---------------------------------------------------------------

    def _notify(self, r: Rollout, action: WebhookAction, reason: str, p_values: dict[str, float], *,
                step: int | None = None, state: State | None = None) -> None:
        if not self.spec.webhook:
            return
        last = self.journal.last_change(self.rid)
        failure = notify(self.spec.webhook, {
            "rollout": self.rid, "at": now_iso(), "stable": r.stable, "canary": r.canary, "action": action,
            "state": str(state or r.state), "step": r.step if step is None else step, "reason": reason,
            "p_values": p_values, "weights": last.weights if last else None,
        })
        if failure is not None:
            self.webhook_failures += 1
            self.journal.log_event(self.rid, EventKind.WEBHOOK_FAILED, {"action": action, "error": failure,
                                                                         "failures": self.webhook_failures})

