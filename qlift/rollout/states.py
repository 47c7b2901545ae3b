"""The rollout's states and the one table of moves between them.

Every state change goes through ``Journal.transition`` (journal.py), which checks this
table inside the write transaction: a move the table does not list is refused, and a
final state is never left.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    SHADOWING = "shadowing"  # the canary gets a mirrored copy of live requests; users see only the stable
    PROGRESSING = "progressing"  # the canary serves its step's share of users; windows are judged
    PAUSED = "paused"  # weights held; no window judged until `resume` (an operator, or too little traffic)
    ABORT_REQUESTED = "abort_requested"  # abort journaled; the data plane has not confirmed 100/0 yet
    BAKING = "baking"  # --bake: the canary has 100%; each window is judged against the stable's last figures
    BAKED = "baked"  # the bake passed: the canary has 100%, the stable still runs until `promote finish`
    PROMOTED = "promoted"  # final: the canary has 100%
    ROLLED_BACK = "rolled_back"  # final: the judge failed the canary; the stable has 100%
    ABORTED = "aborted"  # final: an operator aborted and the data plane confirmed 100/0
    FINISHED = "finished"  # final: a baked canary kept 100% and `promote finish` released the stable

    @property
    def final(self) -> bool:
        return self in FINAL

    @property
    def active(self) -> bool:
        """A controller has work to do (an unconfirmed abort included)."""
        return not self.final


FINAL = frozenset({State.PROMOTED, State.ROLLED_BACK, State.ABORTED, State.FINISHED})
RUNNING = frozenset({State.SHADOWING, State.PROGRESSING, State.BAKING})

TRANSITIONS: dict[State, frozenset[State]] = {
    State.SHADOWING: frozenset({State.PROGRESSING, State.PAUSED, State.ROLLED_BACK, State.ABORT_REQUESTED,
                                State.PROMOTED}),
    State.PROGRESSING: frozenset({State.PAUSED, State.ROLLED_BACK, State.ABORT_REQUESTED, State.PROMOTED,
                                  State.BAKING}),
    State.PAUSED: frozenset({State.PROGRESSING, State.SHADOWING, State.ABORT_REQUESTED, State.PROMOTED,
                             State.BAKING}),
    State.ABORT_REQUESTED: frozenset({State.ABORTED}),
    State.BAKING: frozenset({State.PAUSED, State.ROLLED_BACK, State.ABORT_REQUESTED, State.PROMOTED, State.BAKED}),
    State.BAKED: frozenset({State.FINISHED, State.ABORT_REQUESTED}),
    State.PROMOTED: frozenset(),
    State.ROLLED_BACK: frozenset(),
    State.ABORTED: frozenset(),
    State.FINISHED: frozenset(),
}

DESCRIPTIONS: dict[State, str] = {
    State.SHADOWING: "shadow phase: a share of live requests is mirrored to the canary; its answers are judged "
                     "against the stable's on the same prompts and never reach users",
    State.PROGRESSING: "the canary serves its step's share of users; each window is judged",
    State.PAUSED: "weights held, no window judged until `qlift promote resume` (paused by an operator, by "
                  "too little canary traffic, or by a canary whose model changed)",
    State.ABORT_REQUESTED: "abort journaled, the data plane has not confirmed 100% stable yet: `abort`, `resume` "
                           "or `start` retry until it does",
    State.BAKING: "bake after 100%: the canary serves every user; each window is judged against the stable's "
                  "last figures (kept from before the switch); a failing check rolls back to the still-running stable",
    State.BAKED: "the bake passed: the canary serves every user and the stable still runs (weight 0); "
                 "`qlift promote finish` releases it, `qlift promote abort` still returns every user to it",
    State.PROMOTED: "final: the canary has 100% of the traffic",
    State.ROLLED_BACK: "final: a check failed (or analysis stayed inconclusive); the stable has 100%",
    State.ABORTED: "final: an operator aborted; the data plane confirmed 100% stable",
    State.FINISHED: "final: the canary baked at 100% and `qlift promote finish` released the stable",
}


def can_move(src: State | str, dst: State | str) -> bool:
    return State(dst) in TRANSITIONS[State(src)]


class Phase(StrEnum):
    """What the analysis (analysis.py) does with a judged window: a window record's ``action``."""

    ADVANCE = "advance"  # the step (or the shadow phase, or the bake) passed: the next step's weights
    PASS = "pass"  # this window passed; the step needs more passing windows
    HOLD = "hold"  # inconclusive: the evidence is carried into the next window
    ROLLBACK = "rollback"  # a check failed, or analysis stayed inconclusive for too long
    PAUSE = "pause"  # too little canary traffic for too long: wait for an operator


class DecisionAction(StrEnum):
    """A decision that judged no window (``decisions.action``; a judged window's decision is its ``Phase``)."""

    START = "start"
    PAUSE = "pause"  # an operator's, or the controller's for a canary whose model changed
    RESUME = "resume"
    ABORT = "abort"
    PROMOTE = "promote"  # an operator's `promote promote`
    PROMOTED = "promoted"  # the controller's, at the 100% step
    BAKE = "bake"
    FINISH = "finish"
    OPTIONS = "options"  # `start` on a rollout in progress changed options it may change (options_change.py)


class EventKind(StrEnum):
    """What an event records (``events.kind``)."""

    STATE = "state"  # a transition: {from, to, reason}
    WINDOW_DISCARDED = "window_discarded"
    WEBHOOK_FAILED = "webhook_failed"
    DRIFT = "drift"
    CANARY_IDENTITY = "canary_identity"
    CANARY_CHANGED = "canary_changed"
    CONTROLLER_STOPPED = "controller_stopped"
    CONTROLLER_RESUMED = "controller_resumed"
    # `promote start --next` (train.py): the next version's backend added to the router (or re-pointed), and the
    # version the rollout's end leaves unserved retired from it: intended first, then done
    BACKEND_ADDED = "backend_added"  # {backend, url, model, change: added | repointed, stable, message}
    BACKEND_RETIRING = "backend_retiring"  # {backend, why}
    BACKEND_RETIRED = "backend_retired"  # {backend, why, message}


class StepOutcome(StrEnum):
    """How a step ended (``steps.outcome``; a step still running has none)."""

    PASSED = "passed"  # its windows passed: the next step's weights were applied
    ROLLED_BACK = "rolled_back"
    PROMOTED = "promoted"
    ABORTED = "aborted"


class AdapterState(StrEnum):
    """A ``--canary-adapter``'s record (adapter.py): loading and unloading are intents journaled before
    the server is touched, so a controller killed in between finds them open and settles them."""

    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    UNLOADED = "unloaded"  # final: the rollout rolled back or was aborted, or never started
    KEPT = "kept"  # final: the rollout promoted the adapter; it stays on the server

    @property
    def open(self) -> bool:
        return self in ADAPTER_OPEN


ADAPTER_OPEN = (AdapterState.LOADING, AdapterState.LOADED, AdapterState.UNLOADING)

ADAPTER_TRANSITIONS: dict[AdapterState, frozenset[AdapterState]] = {
    # loading again: a `start` that resumes with an adapter an earlier, killed `start` journaled
    AdapterState.LOADING: frozenset({AdapterState.LOADING, AdapterState.LOADED, AdapterState.UNLOADING,
                                     AdapterState.KEPT}),
    AdapterState.LOADED: frozenset({AdapterState.LOADING, AdapterState.UNLOADING, AdapterState.KEPT}),
    AdapterState.UNLOADING: frozenset({AdapterState.UNLOADING, AdapterState.UNLOADED, AdapterState.LOADING,
                                       AdapterState.KEPT}),
    AdapterState.UNLOADED: frozenset(),
    AdapterState.KEPT: frozenset(),
}


def can_move_adapter(src: AdapterState | str, dst: AdapterState | str) -> bool:
    return AdapterState(dst) in ADAPTER_TRANSITIONS[AdapterState(src)]
