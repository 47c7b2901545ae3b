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

import sqlite3
from typing import Any

from qlift.errors import QliftError
from qlift.rollout import bake
from qlift.rollout.aborts import confirm_abort, journal_marked_abort
from qlift.rollout.analysis import DOWN, Assessment
from qlift.rollout.bake_phase import BakePhase
from qlift.rollout.check_types import Look
from qlift.rollout.dataplane import DataPlane
from qlift.rollout.evidence import Evidence
from qlift.rollout.journal import Journal, Rollout, is_disk_full
from qlift.rollout.preflight import out_of_rotation
from qlift.rollout.shadow import ShadowSource
from qlift.rollout.shadow_phase import ShadowPhase
from qlift.rollout.sources import Collector
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.split_pairs import SplitPairs
from qlift.rollout.stable_reads import make_reader
from qlift.rollout.states import DecisionAction, State, StepOutcome
from qlift.rollout.view import log_window
from qlift.rollout.webhook import WebhookAction
from qlift.rollout.window_loop import EARLY_CHECK_S, Pace, Void, log

__all__ = ["Controller", "Pace", "Void"]


class Controller(ShadowPhase, BakePhase):
    """The reconcile loop over a rollout's phases: the shadow phase (shadow_phase.py), the split steps (here)
    and the bake (bake_phase.py), on the window machinery of window_loop.py."""

    def __init__(self, journal: Journal, rollout_id: int, spec: RolloutSpec, plane: DataPlane,
                 collector: Collector, *, pace: Pace | None = None, shadow_source: ShadowSource | None = None) -> None:
        super().__init__(journal, rollout_id, spec, plane, collector, pace=pace, shadow_source=shadow_source)
        self.split_pairs = _split_pairs(spec, self.shadow_source)
        self.stable_reader = make_reader(spec, self.plane)  # analysis.stable_reads: off, or the stable's vLLM
        self._down_seen: str | None = None  # the router's reason, where it took the canary out during this window
        self._next_paused_check = 0.0

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

    # -- one window ------------------------------------------------------------------

    def _peek(self, r: Rollout, look: Look) -> list[str]:
        try:
            ev = self.collector.peek()
        except QliftError:
            return []
        significant = self.analysis.early_stop(r.step, ev, look)
        if significant:
            log.info("%s already significant: ending the window early", ", ".join(significant))
        return significant

    def _saw_down(self, r: Rollout) -> None:
        """Note the router's reason while it keeps the canary out of rotation during the window (never ends it)."""
        why = out_of_rotation(self.plane, r.canary)
        if why is not None:
            self._down_seen = why

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

    def _look(self, r: Rollout, look: Look) -> list[str]:
        self._saw_down(r)
        return self._peek(r, look)

    def _window(self, r: Rollout, weight: int) -> None:
        ev = self._split_evidence(r, self.analysis.windows.step, self._begin_window, lambda look: self._look(r, look))
        if ev is None:
            return
        if self.split_pairs is not None:  # bounded by shadow.judge_deadline_s
            ev.judged, ev.judge_margin = self.split_pairs.judged(), self.split_pairs.spec.max_judge_loss_margin
        if self.stable_reader is not None and ev.error is None:  # bounded by analysis.stable_reads_deadline_s
            ev.reads = self.stable_reader.read_split(ev)
        self._mark_down(r, ev)
        v = self.analysis.assess(r.step, weight, ev, holds=r.holds, passes=r.passes, errors=r.errors)
        log_window(f"window at {weight}%: canary {ev.canary.requests} requests, stable {ev.stable.requests}",
                   v.phase, v.reason, v.decision.checks)
        self._act(r, v)

    def _moved_on(self, r: Rollout, v: Assessment, step: int | None) -> None:
        if step is None:
            self._advance(r, v)
        else:
            self._leave_shadow(r, v)

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


def _split_pairs(spec: RolloutSpec, shadow_source: ShadowSource | None) -> SplitPairs | None:
    """The split windows' sample for the judge model, where a judge is set and the router can mirror."""
    shadow = spec.shadow
    if shadow is None or shadow.judge is None or not shadow.judge_split_percent or shadow_source is None:
        return None
    return SplitPairs(shadow_source, shadow, spec.stable, spec.canary)
