"""Watching one window, whatever its kind: wait its interval, look at it in progress where its policy ends
windows early, and void it where the weights drifted or the rollout moved on (an operator's command). The
controller (controller.py) judges what comes back; each kind's evidence comes from window_kinds.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from qlift.errors import QliftError
from qlift.rollout.check_types import Look
from qlift.rollout.journal import Journal, Rollout
from qlift.rollout.reconcile import Drift, Reconciler
from qlift.rollout.windows import WindowPolicy

log = logging.getLogger("qlift.rollout.controller")  # one logger for the whole controller

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


@dataclass(frozen=True)
class Watched:
    """A watched window: why it is void (None: judge it), a note, and why its evidence source failed."""

    void: Void | None
    note: str = ""
    failure: str | None = None


def drifted(reconciler: Reconciler) -> Void | None:
    """Why the window is void because the plane's weights drifted (or cannot be read), else None."""
    try:
        if reconciler.reconcile():
            return Void("the data plane's weights drifted during the window (re-applied)")
    except Drift as exc:
        return Void(str(exc))
    return None


def watch(journal: Journal, r: Rollout, reconciler: Reconciler, pace: Pace, policy: WindowPolicy,
          begin: Callable[[], None], peek: Peek) -> Watched:
    """Wait one interval of ``policy``'s (``peek`` ends it early where the policy allows)."""
    reconciler.reconcile()  # an unreachable plane raises Drift: the run loop backs off, comes back here
    failure = None
    try:
        begin()
    except QliftError as exc:
        failure = exc.one_line()
    started = pace.clock()
    deadline = started + policy.interval_s
    next_check = started + EARLY_CHECK_S
    looked = 0.0  # the share of the interval gone at the last look
    while (left := deadline - pace.clock()) > 0:
        pace.sleep(min(pace.tick, left))
        journal.heartbeat()
        state, step = journal.position(r.id)
        if state != r.state or step != r.step or journal.abort_marker.exists():
            return Watched(Void(f"window interrupted: rollout is {state}", interrupted=True))
        if pace.clock() >= next_check:
            next_check = pace.clock() + EARLY_CHECK_S
            if (why := drifted(reconciler)) is not None:
                return Watched(why)
            if failure is None and policy.early_end:
                now = min(1.0, (pace.clock() - started) / policy.interval_s)
                significant, looked = peek(Look(looked, now)), now
                if significant:
                    return Watched(None, f"ended early after {pace.clock() - started:.1f}s: "
                                         f"{', '.join(significant)} already significant")
    return Watched(drifted(reconciler), "", failure)
