"""The shadow phase of the controller: before any user reaches the canary, it answers mirrored copies of live
prompts (``RolloutSpec.shadow``) while the stable serves every user; each window's pairs are judged (windows.py:
``shadow.min_pairs`` pairs, no early end) and the phase passes, holds, pauses or rolls back as a step does."""

from __future__ import annotations

from qlift.errors import QliftError
from qlift.rollout.analysis import SHADOW_STEP, Assessment
from qlift.rollout.journal import Rollout
from qlift.rollout.shadow import ShadowEvidence
from qlift.rollout.stable_reads import StableReader
from qlift.rollout.states import Phase, State
from qlift.rollout.view import log_window
from qlift.rollout.webhook import WebhookAction
from qlift.rollout.window_loop import WindowLoop, log


class ShadowPhase(WindowLoop):
    stable_reader: StableReader | None = None  # the controller's (analysis.stable_reads)

    def _shadow_window(self, r: Rollout) -> None:
        shadow, source, policy = self.spec.shadow, self.shadow_source, self.analysis.windows.shadow
        assert shadow is not None and source is not None and policy is not None
        if not self._ensure_weights(r, r.weights_for(0), "shadow phase: the stable serves every user",
                                    start_step=None):
            return
        source.start(r.canary, shadow.percent, shadow.max_inflight)  # every window: a restarted router forgets it
        void, _, failure = self._watch(r, policy, source.begin, lambda look: [])
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
        if window is not None and self.stable_reader is not None:  # bounded by analysis.stable_reads_deadline_s
            window.reads = self.stable_reader.read_shadow(window)
        if window is None:  # no pairs to judge: no pass (counts toward consecutive_error_limit)
            log.warning("no shadow pairs this window: evidence source failed: %s", failure)
            now = self.clock()
            window = ShadowEvidence(r.stable, r.canary, started_at=now - policy.interval_s, ended_at=now,
                                    notes=[f"evidence source failed: {failure}"], error=failure)
        v = self.analysis.assess_shadow(window, holds=r.holds, passes=r.passes, errors=r.errors)
        pairs = len(v.evidence.pairs) if isinstance(v.evidence, ShadowEvidence) else 0
        log_window(f"shadow window ({shadow.percent}% mirrored): {pairs} pairs", v.phase, v.decision.reason,
                   v.decision.checks)
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
