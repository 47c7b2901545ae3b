"""The controller: a reconcile loop. Each window it re-reads the data plane, converges it to
the journal's weights, watches one window, lets the analysis decide, and acts on the phase.

Everything it decides goes through the journal first (see journal.py), and every state
change through ``Journal.transition``, so a controller killed at any point is resumed by the
next `start`/`resume` at the recorded step. It reads the journal every tick, so `pause`,
`abort` and `promote` from another shell take effect within a tick; an interrupted window is
discarded, never judged. A window during which the weights drifted (a restarted router, a
hand-edited nginx.conf, a reverted HTTPRoute) is discarded too, and the weights re-applied.
Time comes from ``clock`` and ``sleep`` (injectable: tests drive whole rollouts in a blink).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qlift.errors import QliftError
from qlift.rollout import bake, carry
from qlift.rollout.aborts import confirm_abort, journal_marked_abort
from qlift.rollout.analysis import BAKE_STEP, DOWN, SHADOW_STEP, Analysis, Assessment
from qlift.rollout.dataplane import DataPlane, mirror_source
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.identity import canary_changed
from qlift.rollout.journal import Journal, Rollout, is_disk_full, now_iso
from qlift.rollout.planes import SourceName
from qlift.rollout.preflight import out_of_rotation
from qlift.rollout.reconcile import Drift, Reconciler
from qlift.rollout.shadow import ShadowEvidence, ShadowSource
from qlift.rollout.sources import Collector
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.split_pairs import SplitPairs
from qlift.rollout.states import RUNNING, DecisionAction, EventKind, Phase, State, StepOutcome
from qlift.rollout.view import log_window
from qlift.rollout.webhook import WebhookAction, notify

log = logging.getLogger(__name__)

EARLY_CHECK_S = 1.0  # how often a window in progress peeks at the evidence and re-reads the weights
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


class Controller:
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
        self.split_pairs = _split_pairs(spec, self.shadow_source)
        self.reconciler = Reconciler(journal, rollout_id, plane)
        self.webhook_failures = 0
        self._down_seen: str | None = None  # the router's reason, where it took the canary out during this window
        self._retry_s = pace.tick
        self._next_paused_check = 0.0

    @property
    def drifts(self) -> int:
        return self.reconciler.drifts

    # -- the loop --------------------------------------------------------------------

    def run(self) -> Rollout:
        self.recover()
        while True:
            self.journal.heartbeat()
            try:
                r = self.journal.get(self.rid)
                if self.journal.abort_marker.exists() and not r.state.final:
                    self._abort_marked(r)
                    continue
                if r.state.final or r.state == State.BAKED:  # baked: the stable awaits `promote finish`
                    self._converge_final(r)
                    return self.journal.get(self.rid)
                self._step(r)
                self._retry_s = self.tick
            except sqlite3.OperationalError as exc:
                if not is_disk_full(exc):
                    raise
                log.warning("the journal %s is full: the controller changes nothing until there is space "
                            "(`qlift promote abort` still works)", self.journal.path)
                self._back_off()
            except QliftError as exc:  # the data plane (or an evidence source) is unreachable: retry
                log.warning("%s; retrying in %.1fs", exc.one_line(), self._retry_s)
                self._back_off()

    def _back_off(self) -> None:
        self.journal.heartbeat()
        self.sleep(self._retry_s)
        self._retry_s = min(RETRY_MAX_S, self._retry_s * 2)

    def _step(self, r: Rollout) -> None:
        if r.state == State.ABORT_REQUESTED:  # journaled, not confirmed: apply 100% stable until the plane is
            confirm_abort(self.journal, r, self.plane)
        elif r.state == State.PAUSED:  # weights held, and still held where the journal says
            if self.clock() >= self._next_paused_check:
                self._next_paused_check = self.clock() + EARLY_CHECK_S
                self.reconciler.reconcile()
            self.sleep(self.tick)
        elif r.state == State.SHADOWING:
            self._shadow_window(r)
        elif r.state == State.BAKING:
            self._bake_window(r)
        else:
            weight = r.steps[r.step]
            if not self._ensure_weights(r, r.weights_for(weight), f"step {r.step + 1}/{len(r.steps)}: canary "
                                        f"{weight}%", start_step=weight):
                return
            if weight == 100:
                self._promoted(r)
            else:
                self._window(r, weight)

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

    def _watch(self, r: Rollout, begin: Callable[[], None], peek: Callable[[], bool] | None
               ) -> tuple[Void | None, str, str | None]:
        """Wait one interval. Returns (why the window is void or None, a note, why the evidence source failed
        or None). A void window is not judged."""
        self.reconciler.reconcile()  # an unreachable plane raises Drift: the run loop backs off, comes back here
        failure = None
        try:
            begin()
        except QliftError as exc:
            failure = exc.one_line()
        started = self.clock()
        deadline = started + self.spec.interval
        next_check = started + EARLY_CHECK_S
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
                if failure is None and peek is not None and peek():
                    return None, f"ended early after {self.clock() - started:.1f}s: canary errors already " \
                                 "significant", None
        return self._drifted(), "", failure

    def _peek(self, r: Rollout) -> bool:
        try:
            ev = self.collector.peek()
        except QliftError:
            return False
        if self.analysis.early_stop(r.step, ev):
            log.info("canary errors are already significant: ending the window early")
            return True
        return False

    def _saw_down(self, r: Rollout) -> bool:
        """Note the router's reason while it keeps the canary out of rotation during the window (never ends it)."""
        why = out_of_rotation(self.plane, r.canary)
        if why is not None:
            self._down_seen = why
        return False

    def _mark_down(self, r: Rollout, ev: Evidence) -> None:
        """A canary the router keeps out of rotation at the window's end: no measurement (held as ``canary DOWN``,
        rolled back after consecutive_error_limit such windows); one that was out for part of it: a note."""
        why = out_of_rotation(self.plane, r.canary)
        ev.canary.down, ev.canary.down_seen = why, self._down_seen
        if why is not None:
            ev.error = ev.error or f"{DOWN}: {why}"
            log.warning("%s: %s", DOWN, why)
        elif self._down_seen is not None:
            ev.notes.append(f"the router kept the canary out of rotation during the window ({self._down_seen}); "
                            "it was back by the window's end")

    def _begin_window(self) -> None:
        self._down_seen = None
        if self.split_pairs is not None:
            self.split_pairs.begin()
        self.collector.begin()

    def _window(self, r: Rollout, weight: int) -> None:
        void, note, failure = self._watch(r, self._begin_window, lambda: self._saw_down(r) or self._peek(r))
        if void is not None:
            self._discard(r, void)
            return
        if self._canary_changed(r):
            return
        ev: Evidence
        if failure is not None:
            ev = self._no_evidence(r, failure)
        else:
            try:
                ev = self.collector.collect()
                ev.notes += [note] if note else []
            except QliftError as exc:
                ev = self._no_evidence(r, exc.one_line())
        if self.split_pairs is not None:  # bounded by shadow.judge_deadline_s
            ev.judged, ev.judge_margin = self.split_pairs.judged(), self.split_pairs.spec.max_judge_loss_margin
        self._mark_down(r, ev)
        v = self.analysis.assess(r.step, weight, ev, holds=r.holds, passes=r.passes, errors=r.errors)
        log_window(f"window at {weight}%: canary {ev.canary.requests} requests, stable {ev.stable.requests}",
                   v.phase, v.reason, v.decision.checks)
        self._act(r, v)

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
            self._advance(r, v) if step is None else self._leave_shadow(r, v)
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

    def _advance(self, r: Rollout, v: Assessment) -> None:
        nxt = r.step + 1
        weight = r.steps[nxt]

        def also(db: Any) -> None:
            self._journal_window(db, r.step, v)
            self.journal.finish_step(db, self.rid, r.step, StepOutcome.PASSED)
            self.journal.start_step(db, self.rid, nxt, weight)
            self.journal.update(db, self.rid, step=nxt, holds=0, passes=0, errors=0)
            if weight == 100 and self.spec.bake and isinstance(v.evidence, Evidence):
                bake.keep_baseline(db, self.rid, r.step, v.evidence.stable)

        reason = f"step {nxt + 1}/{len(r.steps)}: canary {weight}%"
        if self.journal.change_weights(self.rid, r.weights_for(weight), reason, self.plane.set_weights,
                                       allowed_states=(State.PROGRESSING,), also=also):
            log.info("advanced: %s", reason)
            self._notify(r, WebhookAction.ADVANCE, v.reason, v.decision.p_values, step=nxt)

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

    def _promoted(self, r: Rollout) -> None:
        if self.spec.bake and self._start_bake(r):
            return
        reason = f"canary {r.canary} at 100%: promoted"
        with self.journal.tx() as db:
            if not self.journal.transition(db, self.rid, State.PROGRESSING, State.PROMOTED, reason,
                                           desired_version=r.canary):
                return
            self.journal.finish_step(db, self.rid, r.step, StepOutcome.PROMOTED)
            self.journal.decide(db, self.rid, r.step, DecisionAction.PROMOTED, reason)
        log.info(reason)
        self._notify(r, WebhookAction.PROMOTED, reason, {}, state=State.PROMOTED)

    # -- aborts and final states -----------------------------------------------------

    def _abort_marked(self, r: Rollout) -> None:
        """An abort reached the plane while the journal was full: hold 100% stable, journal it when there is room."""
        stable = r.weights_for(0)
        try:
            actual = self.plane.weights()
        except QliftError:
            actual = None
        if actual != stable:
            with self.journal.weights_lock():
                self.plane.set_weights(stable)
        if not journal_marked_abort(self.journal, r, self.plane):
            self.sleep(max(self.tick, 1.0))

    def _converge_final(self, r: Rollout) -> None:
        """A final state's weights that never reached the plane (it was down) are applied before returning."""
        while True:
            try:
                pending = self.journal.reapply_pending(self.rid, self.plane.set_weights)
                if pending is not None:
                    log.info("applied the journaled weights %s (%s)", pending.weights, pending.reason)
                return
            except QliftError as exc:
                log.warning("the data plane does not take the final weights yet: %s", exc.one_line())
                self._back_off()

    # -- the shadow phase ------------------------------------------------------------

    def _shadow_window(self, r: Rollout) -> None:
        shadow, source = self.spec.shadow, self.shadow_source
        assert shadow is not None and source is not None
        if not self._ensure_weights(r, r.weights_for(0), "shadow phase: the stable serves every user",
                                    start_step=None):
            return
        source.start(r.canary, shadow.percent, shadow.max_inflight)  # every window: a restarted router forgets it
        void, _, failure = self._watch(r, source.begin, None)
        if void is not None:
            self._discard(r, void)
            return
        if self._canary_changed(r):
            return
        window = None
        if failure is None:
            try:
                window = source.collect()
            except QliftError as exc:
                failure = exc.one_line()
        if window is None:  # no pairs to judge: no pass (counts toward consecutive_error_limit)
            log.warning("no shadow pairs this window: evidence source failed: %s", failure)
            now = self.clock()
            window = ShadowEvidence(r.stable, r.canary, started_at=now - self.spec.interval, ended_at=now,
                                    notes=[f"evidence source failed: {failure}"], error=failure)
        v = self.analysis.assess_shadow(window, holds=r.holds, passes=r.passes, errors=r.errors)
        log_window(f"shadow window ({shadow.percent}% mirrored): {_pairs(v.evidence)} pairs",
                   v.phase, v.decision.reason, v.decision.checks)
        self._act(r, v, step=SHADOW_STEP)
        if v.phase in (Phase.ROLLBACK, Phase.ADVANCE):
            self._shadow_off()

    def _leave_shadow(self, r: Rollout, v: Assessment) -> None:
        with self.journal.tx() as db:
            if not self.journal.transition(db, self.rid, State.SHADOWING, State.PROGRESSING, v.reason,
                                           holds=0, passes=0, errors=0):
                return
            self._journal_window(db, SHADOW_STEP, v, reason=v.reason)
        self._notify(r, WebhookAction.ADVANCE, v.reason, v.decision.p_values)

    def _shadow_off(self) -> None:
        try:
            assert self.shadow_source is not None
            self.shadow_source.stop()
        except QliftError as exc:
            log.warning("could not turn the router's shadow mirroring off: %s", exc.one_line())

    # -- the bake after 100% (bake.py) -----------------------------------------------

    def _start_bake(self, r: Rollout) -> bool:
        """progressing -> baking at the 100% step; False (promoted as before) when no stable figures were kept."""
        if bake.baseline(self.journal, self.rid) is None:
            log.warning("no stable figures were kept from before 100%%: promoted without a bake")
            return False
        reason = (f"canary {r.canary} at 100%: baking {self.spec.bake} window(s) against the stable's last figures; "
                  f"the stable {r.stable} keeps running at weight 0")
        with self.journal.tx() as db:
            if self.journal.transition(db, self.rid, State.PROGRESSING, State.BAKING, reason, holds=0, passes=0,
                                       errors=0):
                self.journal.decide(db, self.rid, r.step, DecisionAction.BAKE, reason)
        self.analysis.reset()
        log.info(reason)
        self._notify(r, WebhookAction.BAKE, reason, {}, state=State.BAKING)
        return True

    def _bake_window(self, r: Rollout) -> None:
        if not self._ensure_weights(r, r.weights_for(100), "bake: canary 100%", start_step=None):
            return
        kept = bake.baseline(self.journal, self.rid)
        assert kept is not None  # kept in the transaction that moved to 100% (_advance)
        stable, about = kept

        def peek() -> bool:
            try:
                ev = self.collector.peek()
            except QliftError:
                return False
            if self.analysis.early_stop_bake(ev, stable, about):
                log.info("canary errors are already significant: ending the bake window early")
                return True
            return False

        void, note, failure = self._watch(r, self.collector.begin, peek)
        if void is not None:
            self._discard(r, void)
            return
        if self._canary_changed(r):
            return
        if failure is None:
            try:
                ev = self.collector.collect()
                ev.notes += [note] if note else []
            except QliftError as exc:
                ev = self._no_evidence(r, exc.one_line())
        else:
            ev = self._no_evidence(r, failure)
        v = self.analysis.assess_bake(ev, stable, about, holds=r.holds, passes=r.passes, errors=r.errors)
        log_window(f"bake window at 100%: canary {ev.canary.requests} requests, stable's kept {stable.requests}",
                   v.phase, v.reason, v.decision.checks)
        if v.phase == Phase.ADVANCE:
            self._baked(r, v)
        else:
            self._act(r, v, step=BAKE_STEP)

    def _baked(self, r: Rollout, v: Assessment) -> None:
        with self.journal.tx() as db:
            if not self.journal.transition(db, self.rid, State.BAKING, State.BAKED, v.reason,
                                           desired_version=r.canary, holds=0, passes=0, errors=0):
                return
            self._journal_window(db, BAKE_STEP, v, reason=v.reason)
            self.journal.finish_step(db, self.rid, r.step, StepOutcome.PROMOTED)
        log.info("%s; `qlift promote finish` releases the stable %s", v.reason, r.stable)
        self._notify(r, WebhookAction.BAKED, v.reason, v.decision.p_values, state=State.BAKED)

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


def _pairs(ev: Evidence | ShadowEvidence) -> int:
    return len(ev.pairs) if isinstance(ev, ShadowEvidence) else 0


def _split_pairs(spec: RolloutSpec, shadow_source: ShadowSource | None) -> SplitPairs | None:
    """The split windows' sample for the judge model, where a judge is set and the router can mirror."""
    shadow = spec.shadow
    if shadow is None or shadow.judge is None or not shadow.judge_split_percent or shadow_source is None:
        return None
    return SplitPairs(shadow_source, shadow, spec.stable, spec.canary)
