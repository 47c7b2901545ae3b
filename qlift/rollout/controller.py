"""The controller: a reconcile loop. Each window it re-reads the data plane, converges it to
the journal's weights, watches one window of the rollout's kind (window_kinds.py: a step's, the
shadow phase's, the bake's), lets the analysis say what comes next, and persists that once.

Everything it decides is a ``Next`` (next_state.py) written by ``_persist``: one transaction
(persist.py), then one notify, so a controller killed at any point is resumed by the next
`start`/`resume` at the recorded step. It reads the journal every tick, so `pause`, `abort` and
`promote` from another shell take effect within a tick; an interrupted window is discarded, never
judged. A window during which the weights drifted (a restarted router, a hand-edited nginx.conf, a
reverted HTTPRoute) is discarded too, and the weights re-applied. Time comes from ``pace``
(injectable: tests drive whole rollouts in a blink).
"""

from __future__ import annotations

import sqlite3

from qlift.errors import QliftError
from qlift.rollout import carry, next_state
from qlift.rollout.aborts import confirm_abort, journal_marked_abort, spec_of
from qlift.rollout.analysis import Analysis, WindowState
from qlift.rollout.bake import baseline
from qlift.rollout.check_types import Look
from qlift.rollout.dataplane import DataPlane, mirror_source
from qlift.rollout.identity import canary_changed
from qlift.rollout.journal import Journal, Rollout, is_disk_full
from qlift.rollout.next_state import Carry, Next
from qlift.rollout.persist import announce, commit
from qlift.rollout.reconcile import Reconciler
from qlift.rollout.shadow import ShadowSource
from qlift.rollout.sources import Collector
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.split_pairs import SplitPairs
from qlift.rollout.stable_reads import make_reader
from qlift.rollout.states import RUNNING, EventKind, Phase, State
from qlift.rollout.view import log_window
from qlift.rollout.webhook import WebhookAction
from qlift.rollout.window_kinds import BakeWindows, Needs, ShadowWindows, StepWindows, WindowKind
from qlift.rollout.window_loop import EARLY_CHECK_S, RETRY_MAX_S, Pace, Void, log, watch

__all__ = ["Controller", "Pace", "Void"]


class Controller:
    def __init__(self, journal: Journal, rollout_id: int, spec: RolloutSpec, plane: DataPlane,
                 collector: Collector, *, pace: Pace | None = None, shadow_source: ShadowSource | None = None) -> None:
        self.journal, self.rid, self.spec, self.plane, self.collector = journal, rollout_id, spec, plane, collector
        self.pace = pace or Pace()
        self.tick, self.sleep, self.clock = self.pace.tick, self.pace.sleep, self.pace.clock
        self.analysis = Analysis(spec)
        self._journaled_spec = journal.get(rollout_id).spec  # a `start` with changed options rewrites it
        self.shadow_source = mirror_source(plane, spec) if shadow_source is None else shadow_source
        self.reconciler = Reconciler(journal, rollout_id, plane)
        self.kinds = self._window_kinds()
        self.webhook_failures = 0
        self._retry_s = self.pace.tick
        self._next_paused_check = 0.0

    def _window_kinds(self) -> dict[State, WindowKind]:
        policies, reader = self.analysis.windows, make_reader(self.spec, self.plane)  # analysis.stable_reads
        kinds: dict[State, WindowKind] = {State.PROGRESSING: StepWindows(
            policies.step, self.collector, self.plane, _split_pairs(self.spec, self.shadow_source), reader,
            self.clock)}
        if policies.shadow is not None and self.shadow_source is not None:
            kinds[State.SHADOWING] = ShadowWindows(policies.shadow, self.spec, self.shadow_source, reader, self.clock)
        if policies.bake is not None:
            kinds[State.BAKING] = BakeWindows(policies.bake, self.collector, self.journal, self.clock)
        return kinds

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
                if r.spec != self._journaled_spec:
                    self._respec(r)
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

    def _respec(self, r: Rollout) -> None:
        """The options a `start` changed mid-rollout (options_change.py): the next window is judged with them."""
        self.spec, self._journaled_spec = spec_of(r), r.spec
        self.analysis = Analysis(self.spec)
        self.kinds = self._window_kinds()
        log.info("the rollout's options changed: the next window is judged with them")

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

    def _step(self, r: Rollout) -> None:
        if r.state == State.ABORT_REQUESTED:  # journaled, not confirmed: apply 100% stable until the plane is
            confirm_abort(self.journal, r, self.plane)
        elif r.state == State.PAUSED:  # weights held, and still held where the journal says
            if self.clock() >= self._next_paused_check:
                self._next_paused_check = self.clock() + EARLY_CHECK_S
                self.reconciler.reconcile()
            self.sleep(self.tick)
        else:
            self._window(r, self.kinds[r.state])

    # -- one window ------------------------------------------------------------------

    def _window(self, r: Rollout, kind: WindowKind) -> None:
        needs = kind.needs(r)
        if not self._ensure_weights(r, needs):
            return
        if needs.canary == 100 and r.state == State.PROGRESSING:
            self._persist(r, self._at_100(r))
            return
        kind.arm(r)
        at = WindowState(r, self._held())

        def peek(look: Look) -> list[str]:
            significant = self.analysis.early_stop(kind.policy, at, kind.peek(r), look)
            if significant:
                log.info("%s already significant: ending the window early", ", ".join(significant))
            return significant

        watched = watch(self.journal, r, self.reconciler, self.pace, kind.policy, lambda: kind.begin(r), peek)
        if watched.void is not None:
            self._discard(r, watched.void)
            return
        if self._canary_changed(r):
            return
        ev = kind.collect(r, watched, kind.policy.interval_s)
        nxt = self.analysis.assess(kind.policy, ev, at).naming_journal(self.journal.path)
        assert nxt.window is not None and nxt.phase is not None
        judged = self.analysis.with_carry(kind.policy, at, ev)
        log_window(kind.describe(ev, judged), nxt.phase, nxt.window.record["reason"], list(nxt.window.checks))
        self._persist(r, nxt)
        if nxt.phase in (Phase.ROLLBACK, Phase.ADVANCE):
            kind.ended(nxt.phase == Phase.ADVANCE)

    def _held(self) -> Carry | None:
        """The held evidence the journal keeps (a killed controller's too): judged on with the next window."""
        held = self.journal.carry(self.rid)
        return None if held is None else (held[0], carry.load(held[1], held[2]))

    def _at_100(self, r: Rollout) -> Next:
        """The 100% step reached: promoted, or the bake begins (where the stable's figures were kept)."""
        if self.spec.bake:
            if baseline(self.journal, self.rid) is not None:
                return next_state.bake_started(r.stable, r.canary, self.spec.bake)
            log.warning("no stable figures were kept from before 100%%: promoted without a bake")
        return next_state.promoted(r.stable, r.canary)

    def _ensure_weights(self, r: Rollout, needs: Needs) -> bool:
        want = r.weights_for(needs.canary)
        last = self.journal.last_change(self.rid)
        if last is not None and last.weights == want:
            if last.applied_at is None:  # journaled, but the plane was down: apply it now
                self.journal.reapply_pending(self.rid, self.plane.set_weights)
            return True
        log.info("%s -> weights %s", needs.reason, want)
        also = None
        if needs.start_step is not None:
            def also(db: sqlite3.Connection) -> None:
                self.journal.start_step(db, self.rid, r.step, needs.start_step)  # type: ignore[arg-type]
        return self.journal.change_weights(self.rid, want, needs.reason, self.plane.set_weights,
                                           allowed_states=tuple(RUNNING), also=also)

    def _canary_changed(self, r: Rollout) -> bool:
        """Pause, unjudged, when the canary's model is not the one this rollout's evidence is about."""
        why = canary_changed(self.journal, self.rid, self.plane, r.canary)
        if why is not None:
            self._persist(r, next_state.canary_changed(why))  # never judge the new model on the old one's evidence
        return why is not None

    def _discard(self, r: Rollout, void: Void) -> None:
        log.warning("window discarded: %s", void.reason)
        if not void.interrupted:
            self.journal.log_event(self.rid, EventKind.WINDOW_DISCARDED, {"step": r.step, "state": r.state,
                                                                           "reason": void.reason})

    # -- the one write ---------------------------------------------------------------

    def _persist(self, r: Rollout, nxt: Next) -> None:
        """``nxt`` in one transaction (weights it changes journaled first, then applied), then one notify;
        nothing when another process moved the rollout meanwhile. A final state's weights that the plane
        refused are retried by ``_converge_final`` until applied."""
        nxt = nxt.naming_journal(self.journal.path)  # as commit journals it
        if not commit(self.journal, r, nxt, self.plane.set_weights):
            return
        if nxt.state == State.BAKED:
            log.info("%s; `qlift promote finish` releases the stable %s", nxt.reason, r.stable)
        elif nxt.state in (State.ROLLED_BACK, State.PAUSED):
            log.warning("%s: %s", "rolled back" if nxt.state == State.ROLLED_BACK else "paused", nxt.reason)
        elif nxt.webhook == WebhookAction.ADVANCE and nxt.weights is not None:
            log.info("advanced: %s", nxt.weights.reason)
        elif nxt.state != r.state:
            log.info("%s", nxt.reason)
        failure = announce(self.spec.webhook, self.journal, r, nxt)
        if failure is not None:
            self.webhook_failures += 1
            self.journal.log_event(self.rid, EventKind.WEBHOOK_FAILED, {"action": nxt.webhook, "error": failure,
                                                                         "failures": self.webhook_failures})

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
