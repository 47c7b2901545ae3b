"""The bake windows of the controller (``RolloutSpec.bake``, bake.py): after the 100% step, N more windows with
the canary serving every user, judged by the step's checks against the stable's figures kept from its last
window before the switch (windows.py: ``min_requests``, early end on significant canary errors)."""

from __future__ import annotations

from qlift.errors import QliftError
from qlift.rollout import bake
from qlift.rollout.analysis import BAKE_STEP, Assessment
from qlift.rollout.check_types import Look
from qlift.rollout.journal import Rollout
from qlift.rollout.states import DecisionAction, Phase, State, StepOutcome
from qlift.rollout.view import log_window
from qlift.rollout.webhook import WebhookAction
from qlift.rollout.window_loop import WindowLoop, log


class BakePhase(WindowLoop):
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
        policy = self.analysis.windows.bake
        assert policy is not None
        if not self._ensure_weights(r, r.weights_for(100), "bake: canary 100%", start_step=None):
            return
        kept = bake.baseline(self.journal, self.rid)
        assert kept is not None  # kept in the transaction that moved to 100% (Controller._advance)
        stable, about = kept

        def peek(look: Look) -> list[str]:
            try:
                ev = self.collector.peek()
            except QliftError:
                return []
            significant = self.analysis.early_stop_bake(ev, stable, about, look)
            if significant:
                log.info("%s already significant: ending the bake window early", ", ".join(significant))
            return significant

        ev = self._split_evidence(r, policy, self.collector.begin, peek)
        if ev is None:
            return
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
