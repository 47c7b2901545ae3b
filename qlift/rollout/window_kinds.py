"""What the controller watches in a window of each kind: the weights it needs, how it begins, what a look at it
in progress sees, and its evidence at the end. The analysis judges all three the same way; where they differ in
judgement, their ``WindowPolicy`` (windows.py) says so.

- ``StepWindows``: a split step (the router's evidence, the judge model's sample of split pairs, the stable's
  reading of both answers, and whether the router kept the canary out of rotation);
- ``ShadowWindows``: mirrored prompts answered by both versions (the judge model's verdicts on the pairs);
- ``BakeWindows``: a split window at 100% against the stable's figures kept from before the switch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from qlift.errors import QliftError
from qlift.rollout.analysis import DOWN
from qlift.rollout.bake import baseline
from qlift.rollout.dataplane import DataPlane
from qlift.rollout.evidence import Evidence, VersionEvidence, unique
from qlift.rollout.journal import Journal, Rollout
from qlift.rollout.next_state import Held
from qlift.rollout.planes import SourceName
from qlift.rollout.preflight import out_of_rotation
from qlift.rollout.shadow import ShadowEvidence, ShadowSource, judge_window
from qlift.rollout.sources import Collector
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.split_pairs import SplitPairs
from qlift.rollout.stable_reads import StableReader
from qlift.rollout.window_loop import Watched
from qlift.rollout.windows import WindowPolicy

log = logging.getLogger("qlift.rollout.controller")


@dataclass(frozen=True)
class Needs:
    """The weights a window needs: the canary's percent, why (logged), and the step started with them."""

    canary: int
    reason: str
    start_step: int | None = None


class WindowKind(Protocol):
    policy: WindowPolicy

    def needs(self, r: Rollout) -> Needs: ...

    def arm(self, r: Rollout) -> None:
        """Before the window is watched (raises where the plane cannot be reached: the controller retries)."""

    def begin(self, r: Rollout) -> None: ...

    def peek(self, r: Rollout) -> Evidence | None:
        """The evidence so far (a window whose policy ends early), None where it cannot be read."""

    def collect(self, r: Rollout, watched: Watched, window_s: float) -> Held:
        """The window's evidence (with ``watched``'s note); no evidence (``error`` set) where its source failed."""

    def describe(self, ev: Held, judged: Held) -> str:
        """The window's line on stderr: ``ev`` its own evidence, ``judged`` with its step's held windows'."""

    def ended(self, moved_on: bool) -> None:
        """The rollout left this kind of window (rolled back or passed)."""


def no_evidence(r: Rollout, failure: str, now: float, window_s: float) -> Evidence:
    # No evidence is no pass: the window holds (and counts toward consecutive_error_limit).
    note = f"evidence source failed: {failure}"
    log.warning("no evidence this window: %s", note)
    return Evidence(VersionEvidence(r.stable), VersionEvidence(r.canary), now - window_s, now, SourceName.NONE,
                    notes=[note], error=failure)


class StepWindows:
    def __init__(self, policy: WindowPolicy, collector: Collector, plane: DataPlane, split_pairs: SplitPairs | None,
                 stable_reader: StableReader | None, clock: Callable[[], float]) -> None:
        self.policy, self.collector, self.plane = policy, collector, plane
        self.split_pairs, self.stable_reader, self.clock = split_pairs, stable_reader, clock
        self._down_seen: str | None = None  # the router's reason, where it took the canary out during this window

    def needs(self, r: Rollout) -> Needs:
        weight = r.steps[r.step]
        return Needs(weight, f"step {r.step + 1}/{len(r.steps)}: canary {weight}%", start_step=weight)

    def arm(self, r: Rollout) -> None:
        return None

    def begin(self, r: Rollout) -> None:
        self._down_seen = None
        if self.split_pairs is not None:
            self.split_pairs.begin()
        self.collector.begin()

    def peek(self, r: Rollout) -> Evidence | None:
        why = out_of_rotation(self.plane, r.canary)  # noted, never ends the window
        if why is not None:
            self._down_seen = why
        try:
            return self.collector.peek()
        except QliftError:
            return None

    def collect(self, r: Rollout, watched: Watched, window_s: float) -> Held:
        ev = _collected(self.collector, r, watched, self.clock(), window_s)
        if self.split_pairs is not None:  # bounded by shadow.judge_deadline_s
            ev.judged, ev.judge_margin = self.split_pairs.judged(), self.split_pairs.spec.max_judge_loss_margin
        if self.stable_reader is not None and ev.error is None:  # bounded by analysis.stable_reads_deadline_s
            ev.reads = self.stable_reader.read_split(ev)
        self._mark_down(r, ev)
        return ev

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

    def describe(self, ev: Held, judged: Held) -> str:
        assert isinstance(ev, Evidence)
        return f"window at {ev.weight}%: canary {ev.canary.requests} requests, stable {ev.stable.requests}"

    def ended(self, moved_on: bool) -> None:
        return None


class BakeWindows:
    def __init__(self, policy: WindowPolicy, collector: Collector, journal: Journal, clock: Callable[[], float]
                 ) -> None:
        self.policy, self.collector, self.journal, self.clock = policy, collector, journal, clock
        self._kept: tuple[VersionEvidence, str] | None = None

    def needs(self, r: Rollout) -> Needs:
        return Needs(100, "bake: canary 100%")

    def arm(self, r: Rollout) -> None:
        return None

    def begin(self, r: Rollout) -> None:
        self._kept = baseline(self.journal, r.id)
        assert self._kept is not None  # kept in the transaction that moved to 100% (analysis: the step passed)
        self.collector.begin()

    def _against_kept(self, ev: Evidence) -> Evidence:
        """At 100% the stable serves nobody: its figures are the ones kept from its last window before."""
        assert self._kept is not None
        ev.stable = self._kept[0]
        ev.notes = unique([*ev.notes, self._kept[1]])
        return ev

    def peek(self, r: Rollout) -> Evidence | None:
        try:
            ev = self.collector.peek()
        except QliftError:
            return None
        return None if ev is None else self._against_kept(ev)

    def collect(self, r: Rollout, watched: Watched, window_s: float) -> Held:
        return self._against_kept(_collected(self.collector, r, watched, self.clock(), window_s))

    def describe(self, ev: Held, judged: Held) -> str:
        assert isinstance(ev, Evidence)
        return f"bake window at 100%: canary {ev.canary.requests} requests, stable's kept {ev.stable.requests}"

    def ended(self, moved_on: bool) -> None:
        return None


class ShadowWindows:
    def __init__(self, policy: WindowPolicy, spec: RolloutSpec, source: ShadowSource,
                 stable_reader: StableReader | None, clock: Callable[[], float]) -> None:
        assert spec.shadow is not None
        self.policy, self.shadow, self.source = policy, spec.shadow, source
        self.stable_reader, self.clock = stable_reader, clock

    def needs(self, r: Rollout) -> Needs:
        return Needs(0, "shadow phase: the stable serves every user")

    def arm(self, r: Rollout) -> None:
        self.source.start(r.canary, self.shadow.percent, self.shadow.max_inflight)  # a restarted router forgets it

    def begin(self, r: Rollout) -> None:
        self.source.begin()

    def peek(self, r: Rollout) -> Evidence | None:
        return None  # its pairs trickle in: a shadow window runs its whole interval

    def collect(self, r: Rollout, watched: Watched, window_s: float) -> Held:
        window, failure = None, watched.failure
        if failure is None:
            try:
                window = self.source.collect()
            except QliftError as exc:
                failure = exc.one_line()
        if window is not None and self.stable_reader is not None:  # bounded by analysis.stable_reads_deadline_s
            window.reads = self.stable_reader.read_shadow(window)
        if window is None:  # no pairs to judge: no pass (counts toward consecutive_error_limit)
            log.warning("no shadow pairs this window: evidence source failed: %s", failure)
            now = self.clock()
            window = ShadowEvidence(r.stable, r.canary, started_at=now - window_s, ended_at=now,
                                    notes=[f"evidence source failed: {failure}"], error=failure)
        window.judged = judge_window(window, self.shadow)  # the judge model, bounded by shadow.judge_deadline_s
        return window

    def describe(self, ev: Held, judged: Held) -> str:
        pairs = len(judged.pairs) if isinstance(judged, ShadowEvidence) else 0
        return f"shadow window ({self.shadow.percent}% mirrored): {pairs} pairs"

    def ended(self, moved_on: bool) -> None:
        try:
            self.source.stop()
        except QliftError as exc:
            log.warning("could not turn the router's shadow mirroring off: %s", exc.one_line())


def _collected(collector: Collector, r: Rollout, watched: Watched, now: float, window_s: float) -> Evidence:
    if watched.failure is not None:
        return no_evidence(r, watched.failure, now, window_s)
    try:
        ev = collector.collect()
    except QliftError as exc:
        return no_evidence(r, exc.one_line(), now, window_s)
    ev.notes += [watched.note] if watched.note else []
    return ev
