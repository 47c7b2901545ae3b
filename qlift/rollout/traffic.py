"""Why a window saw too few canary requests, from what the router counted.

Four causes, told apart by the window's own counts, not by arithmetic on the planned share alone:
the canary out of rotation (the router's health view), no requests at all, sessions pinned to the
stable (requests carrying a session key stay on the version their key hashes to, so a few long
sessions can all miss the canary's slice), and too little traffic for the window. Only the last is
fixed by a longer ``--interval``, and only that one names one, never one already in use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from qlift.rollout.evidence import Evidence


class Cause(StrEnum):
    DOWN = "canary_down"
    NO_TRAFFIC = "no_traffic"
    STICKY = "sessions_pinned"
    VOLUME = "too_little_traffic"
    SHARE = "under_share"


@dataclass(frozen=True)
class TrafficCause:
    cause: Cause
    text: str
    needed_interval_s: float | None = None  # set only where a longer window is the fix

    @property
    def interval_needed(self) -> int | None:
        """``needed_interval_s`` as an --interval in whole seconds."""
        return None if self.needed_interval_s is None else whole_seconds(self.needed_interval_s)


def whole_seconds(seconds: float) -> int:
    return math.ceil(seconds - 1e-9)


def expected_count(share: float, requests_per_s: float, seconds: float) -> float:
    """The one rule of window sizing: a window counts weight x requests/s x interval of the canary's requests (or,
    mirrored, of its shadow pairs); it can pass only where that is >= its minimum."""
    return share * requests_per_s * seconds


def interval_for(min_count: int, share: float, requests_per_s: float) -> float:
    """The window length at which ``expected_count`` reaches ``min_count``."""
    return min_count / (share * requests_per_s)


@dataclass(frozen=True)
class TrafficCounts:
    """What the router counted over ``windows`` windows spanning ``window_s`` seconds, at the planned canary
    ``share`` (0-1); ``sessions``: requests of either version with a session key; ``down``: the router's reason
    for keeping the canary out of rotation now (at the window's end); ``was_down``: its reason at some look during
    these windows, the canary back in rotation since."""

    canary: int
    stable: int
    share: float
    window_s: float
    windows: int
    min_requests: int
    sessions: int | None = None
    down: str | None = None
    was_down: str | None = None

    @classmethod
    def of(cls, ev: Evidence, *, share: float, window_s: float, min_requests: int) -> TrafficCounts:
        sessions = None if ev.canary.sessions is None and ev.stable.sessions is None else \
            (ev.canary.sessions or 0) + (ev.stable.sessions or 0)
        down = ev.canary.down  # the router's view now: a canary back in rotation is no longer the cause to fix
        return cls(ev.canary.requests, ev.stable.requests, share, window_s, ev.windows, min_requests, sessions,
                   down, None if down is not None else ev.canary.down_seen)

    @property
    def requests_per_s(self) -> float:
        """Both versions together over the span."""
        return (self.canary + self.stable) / max(self.window_s, 1e-9)


def explain(counts: TrafficCounts) -> TrafficCause:
    """The cause of the canary's count < ``min_requests``: the one rule of window sizing (weight x requests/s x
    interval >= min_requests), which the judge's ``Sizing`` and the analysis's pause advice both read. A canary
    the router took out and has put back is said so, then the cause that stands now."""
    cause = _explain(counts)
    back = back_in_rotation(counts)
    return cause if back is None else replace(cause, text=f"{back}; now: {cause.text}")


def back_in_rotation(counts: TrafficCounts) -> str | None:
    """Where the router took the canary out during these windows and has put it back: said so, never as the cause
    to fix (None otherwise)."""
    if counts.was_down is None:
        return None
    return (f"the router kept the canary out of rotation for part of these windows ({counts.was_down}) and has put "
            f"it back, so part of its {counts.share:.0%} went to the stable")


def _explain(counts: TrafficCounts) -> TrafficCause:
    canary, stable, share, min_requests = counts.canary, counts.stable, counts.share, counts.min_requests
    window_s, windows, sessions, down = counts.window_s, counts.windows, counts.sessions, counts.down
    total = canary + stable
    span = max(window_s, 1e-9)
    if down is not None:
        return TrafficCause(Cause.DOWN, f"canary DOWN: {down}: the router keeps it out of rotation, so its "
                                        f"{share:.0%} went to the stable ({stable} requests); bring its server back "
                                        "(a longer window would not help)")
    if total == 0:
        return TrafficCause(Cause.NO_TRAFFIC, f"no traffic: the router counted no requests in {span:.0f}s; send "
                                              "traffic through it (a longer window would not help)")
    expected = share * total
    if sessions and share < 1 and sessions * 2 >= total and canary < expected / 2:
        return TrafficCause(Cause.STICKY, f"sessions pinned to the stable: {sessions} of {total} requests carried a "
                                          "session key (X-Session-Id or user), and the router keeps each session on "
                                          f"one version, so the canary's {share:.0%} slice got {canary} (about "
                                          f"{expected:.0f} expected); more distinct sessions, a larger first step or "
                                          "a lower --min-requests, not a longer window")
    rps = total / span
    expected_in_span = expected_count(share, rps, span)
    if expected_in_span < min_requests and share > 0:
        exact = interval_for(min_requests, share, rps)
        need = whole_seconds(exact)
        per_window = span / max(windows, 1)
        text = (f"canary {share:.0%} x {rps:.3g} req/s x {span:.0f}s = {expected_in_span:.1f} requests < "
                f"min_requests {min_requests}")
        if need > per_window:
            return TrafficCause(Cause.VOLUME, text + f"; needs --interval >= {need}s at this traffic, more traffic, "
                                                     "or a lower --min-requests", exact)
        return TrafficCause(Cause.VOLUME, text + "; more traffic, or a lower --min-requests")
    return TrafficCause(Cause.SHARE, f"the canary got {canary} of {total} requests, under its {share:.0%} share "
                                     f"({expected:.1f} expected): not a window-length problem; the step's next window "
                                     "adds to this one")


@dataclass(frozen=True)
class PlannedWindow:
    """A window a rollout is about to run, as sizing sees it: ``share`` of the requests counts toward its
    ``min_count`` (set by ``min_flag``), and up to ``windows`` of them add up before the rollout pauses (the held
    ones max_inconclusive allows, whose evidence carries)."""

    name: str  # "step 1 (canary 10%)", "the bake (canary 100%)", "the shadow phase (20% mirrored)"
    share: float
    min_count: int
    min_flag: str  # --min-requests, --shadow-min-pairs
    unit: str  # requests, pairs
    windows: int


def forecast(window: PlannedWindow, requests_per_s: float, interval_s: float) -> TrafficCause | None:
    """Can ``window`` reach its minimum at ``requests_per_s`` before its held windows run out? None where it can;
    else the cause in the rule's words, with the interval (and the minimum) at which one window reaches it."""
    per_window = expected_count(window.share, requests_per_s, interval_s)
    if per_window * window.windows >= window.min_count or window.share <= 0:
        return None
    exact = interval_for(window.min_count, window.share, requests_per_s)
    lower = f" or {window.min_flag} {math.floor(per_window)}" if per_window >= 1 else ""
    return TrafficCause(Cause.VOLUME, f"{window.name}: {window.share:.0%} x {requests_per_s:.3g} req/s x "
                                      f"{interval_s:g}s = {per_window:.1f} {window.unit} a window < "
                                      f"{window.min_flag} {window.min_count} ({per_window * window.windows:.1f} "
                                      f"over the {window.windows} window(s) it may hold); needs --interval "
                                      f">= {whole_seconds(exact)}s{lower} at this traffic", exact)
