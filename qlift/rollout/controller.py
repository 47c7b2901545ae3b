"""The controller loop: set the step's weights, watch one window, judge, act; repeat.

Everything it decides goes through the journal first (see journal.py), so a controller
killed at any point is resumed by the next `start`/`resume` at the recorded step. It reads
the journal every tick, so `pause`, `abort` and `promote` from another shell take effect
within a tick; an interrupted window is discarded, never judged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from qlift.errors import QliftError
from qlift.rollout.dataplane import DataPlane
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.journal import FINAL_STATES, Journal, Rollout, now_iso
from qlift.rollout.judge import Decision, check_error_rate, judge
from qlift.rollout.sources import Collector
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.webhook import notify

log = logging.getLogger(__name__)

EARLY_CHECK_S = 1.0  # how often a window in progress is checked for significant canary errors


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def window_record(ev: Evidence, decision: Decision, action: str, reason: str) -> dict[str, Any]:
    return {
        "started_at": _iso(ev.started_at), "ended_at": _iso(ev.ended_at), "source": ev.source,
        "stable": ev.stable.summary(), "canary": ev.canary.summary(), "action": action, "reason": reason,
        "checks": [asdict(c) for c in decision.checks],
        "notes": ev.notes + ([f"cumulative over {ev.windows} windows of this step"] if ev.windows > 1 else []),
    }


class Controller:
    def __init__(self, journal: Journal, rollout_id: int, spec: RolloutSpec, plane: DataPlane,
                 collector: Collector, *, tick: float = 0.25, sleep: Callable[[float], None] = time.sleep) -> None:
        self.journal, self.rid, self.spec, self.plane, self.collector = journal, rollout_id, spec, plane, collector
        self.tick = tick
        self.sleep = sleep
        # Evidence of this step's held (inconclusive) windows: the next window adds to it, so a
        # 10% step under light traffic grows its sample instead of judging each thin slice alone.
        self.carry: tuple[int, Evidence] | None = None

    # -- the loop --------------------------------------------------------------------

    def run(self) -> Rollout:
        self.recover()
        while True:
            r = self.journal.get(self.rid)
            if r.state in FINAL_STATES:
                return r
            if r.state == "paused":
                self.sleep(self.tick)
                continue
            weight = r.steps[r.step]
            if not self._ensure_step_weights(r, weight):
                continue
            if weight == 100:
                self._promoted(r)
                continue
            ev = self._watch_window(r)
            if ev is None:
                continue
            if self.carry is not None and self.carry[0] == r.step:
                ev = self.carry[1].merged(ev)
            d = judge(ev, self.spec.analysis)
            self.carry = (r.step, ev) if d.action == "hold" else None
            self._act(r, ev, d)

    def recover(self) -> None:
        """Re-apply weights journaled but never applied; restore the journal's weights if the data plane drifted."""
        pending = self.journal.reapply_pending(self.rid, self.plane.set_weights)
        if pending is not None:
            log.info("re-applied journaled weights %s (%s)", pending.weights, pending.reason)
        last = self.journal.last_change(self.rid)
        if last is None:
            return
        try:
            actual = self.plane.weights()
        except Exception as exc:  # an unreadable data plane is set again below
            log.warning("could not read the data plane's weights: %s", exc)
            actual = None
        if actual is None or any(actual.get(k, 0) != v for k, v in last.weights.items()):
            log.warning("data plane weights %s differ from the journal's %s: setting the journal's",
                        actual, last.weights)
            with self.journal.weights_lock():
                self.plane.set_weights(last.weights)

    def _ensure_step_weights(self, r: Rollout, weight: int) -> bool:
        want = r.weights_for(weight)
        last = self.journal.last_change(self.rid)
        if last is not None and last.weights == want:
            return True
        reason = f"step {r.step + 1}/{len(r.steps)}: canary {weight}%"
        log.info("%s -> weights %s", reason, want)
        return self.journal.change_weights(
            self.rid, want, reason, self.plane.set_weights, allowed_states=("progressing",),
            also=lambda db: self.journal.start_step(db, self.rid, r.step, weight))

    def _watch_window(self, r: Rollout) -> Evidence | None:
        failure: str | None = None
        try:
            self.collector.begin()
        except QliftError as exc:
            failure = exc.one_line()
        started = time.time()
        early: str | None = None
        deadline = time.monotonic() + self.spec.interval
        next_peek = time.monotonic() + EARLY_CHECK_S
        while (left := deadline - time.monotonic()) > 0:
            self.sleep(min(self.tick, left))
            now = self.journal.get(self.rid)
            if now.state != "progressing" or now.step != r.step:
                log.info("window interrupted: rollout is %s", now.state)
                return None
            if failure is None and time.monotonic() >= next_peek:
                next_peek = time.monotonic() + EARLY_CHECK_S
                if self._errors_already_fail(r):
                    early = f"ended early after {time.time() - started:.1f}s: canary errors already significant"
                    break
        if failure is None:
            try:
                ev = self.collector.collect()
                ev.notes += [early] if early else []
                return ev
            except QliftError as exc:
                failure = exc.one_line()
        # No evidence is no pass: the window holds (and counts toward max_inconclusive).
        log.warning("no evidence this window: %s", failure)
        return Evidence(VersionEvidence(r.stable), VersionEvidence(r.canary), started, time.time(),
                        "none", notes=[f"evidence source failed: {failure}"])

    def _errors_already_fail(self, r: Rollout) -> bool:
        """A failing canary need not wait for the window's end: once its errors are significant
        (the same test as the window's), the window ends now and is judged in full."""
        try:
            ev = self.collector.peek()
        except QliftError:
            return False
        if ev is None:
            return False
        if self.carry is not None and self.carry[0] == r.step:
            ev = self.carry[1].merged(ev)
        if check_error_rate(ev.canary, ev.stable, self.spec.analysis).status != "fail":
            return False
        log.info("canary errors are already significant: ending the window early")
        return True

    # -- decisions -------------------------------------------------------------------

    def _act(self, r: Rollout, ev: Evidence, d: Decision) -> None:
        a = self.spec.analysis
        log.info("window at %d%%: canary %d requests, stable %d: %s (%s)", r.steps[r.step], ev.canary.requests,
                 ev.stable.requests, d.action, d.reason)
        if d.action == "hold" and r.holds + 1 > a.max_inconclusive:
            d = Decision("rollback", f"inconclusive for {r.holds + 1} windows (max_inconclusive "
                                     f"{a.max_inconclusive}): {d.reason}", d.checks)
        if d.action == "rollback":
            self._rollback(r, ev, d)
        elif d.action == "hold":
            self._record(r, ev, d, "hold", holds=r.holds + 1)
        elif r.passes + 1 < a.intervals_per_step:
            self._record(r, ev, d, "pass", passes=r.passes + 1)
        else:
            self._advance(r, ev, d)

    def _record(self, r: Rollout, ev: Evidence, d: Decision, action: str, **fields: Any) -> None:
        with self.journal.tx() as db:
            if self.journal.get(self.rid).state != "progressing":
                return
            wid = self.journal.add_window(db, self.rid, r.step, window_record(ev, d, action, d.reason))
            self.journal.decide(db, self.rid, r.step, action, d.reason, window_id=wid, p_values=d.p_values)
            self.journal.update(db, self.rid, **fields)
        self._notify(r, action, d.reason, d.p_values)

    def _advance(self, r: Rollout, ev: Evidence, d: Decision) -> None:
        nxt = r.step + 1
        weight = r.steps[nxt]

        def also(db: Any) -> None:
            wid = self.journal.add_window(db, self.rid, r.step, window_record(ev, d, "advance", d.reason))
            self.journal.decide(db, self.rid, r.step, "advance", d.reason, window_id=wid, p_values=d.p_values)
            self.journal.finish_step(db, self.rid, r.step, "passed")
            self.journal.start_step(db, self.rid, nxt, weight)
            self.journal.update(db, self.rid, step=nxt, holds=0, passes=0)

        reason = f"step {nxt + 1}/{len(r.steps)}: canary {weight}%"
        if self.journal.change_weights(self.rid, r.weights_for(weight), reason, self.plane.set_weights,
                                       allowed_states=("progressing",), also=also):
            log.info("advanced: %s", reason)
            self._notify(r, "advance", d.reason, d.p_values, step=nxt)

    def _rollback(self, r: Rollout, ev: Evidence, d: Decision) -> None:
        def also(db: Any) -> None:
            wid = self.journal.add_window(db, self.rid, r.step, window_record(ev, d, "rollback", d.reason))
            self.journal.decide(db, self.rid, r.step, "rollback", d.reason, window_id=wid, p_values=d.p_values)
            self.journal.finish_step(db, self.rid, r.step, "rolled_back")
            self.journal.update(db, self.rid, state="rolled_back", desired_version=r.stable, reason=d.reason)

        if self.journal.change_weights(self.rid, r.weights_for(0), "rollback", self.plane.set_weights,
                                       allowed_states=("progressing",), also=also):
            log.warning("rolled back: %s", d.reason)
            self._notify(r, "rollback", d.reason, d.p_values, state="rolled_back")

    def _promoted(self, r: Rollout) -> None:
        reason = f"canary {r.canary} at 100%: promoted"
        with self.journal.tx() as db:
            if self.journal.get(self.rid).state != "progressing":
                return
            self.journal.finish_step(db, self.rid, r.step, "promoted")
            self.journal.decide(db, self.rid, r.step, "promoted", reason)
            self.journal.update(db, self.rid, state="promoted", desired_version=r.canary, reason=reason)
        log.info(reason)
        self._notify(r, "promoted", reason, {}, state="promoted")

    def _notify(self, r: Rollout, action: str, reason: str, p_values: dict[str, float], *,
                step: int | None = None, state: str | None = None) -> None:
        if not self.spec.webhook:
            return
        last = self.journal.last_change(self.rid)
        notify(self.spec.webhook, {
            "rollout": self.rid, "at": now_iso(), "stable": r.stable, "canary": r.canary, "action": action,
            "state": state or "progressing", "step": r.step if step is None else step, "reason": reason,
            "p_values": p_values, "weights": last.weights if last else None,
        })
