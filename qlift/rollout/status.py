"""`qlift promote status`: everything about one rollout, typed. The CLI renders it as text (view.py) and as
``--json`` (its fields, the enums as their strings); ``api.status`` gives the same as plain JSON values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlift.errors import NotFoundError
from qlift.rollout.aborts import spec_of
from qlift.rollout.analysis import BAKE_STEP, SHADOW_STEP
from qlift.rollout.bake import BakeStatus, bake_status
from qlift.rollout.interruptions import Interruption, interruptions, live_weights
from qlift.rollout.journal import Journal, default_journal
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.states import DESCRIPTIONS, EventKind, State, StepOutcome

HEARTBEAT_STALE_S = 30.0  # a controller silent this long is shown as stalled

Record = dict[str, Any]  # a journaled window, decision, weight change or event, as `history` reads it


@dataclass
class ControllerStatus:
    pid: int | None
    alive: bool
    heartbeat_age_s: float | None
    stalled: bool


@dataclass
class StepStatus:
    index: int
    weight: int
    started_at: str | None
    finished_at: str | None
    outcome: StepOutcome | None
    judged: str  # how this step is judged, in words
    windows: list[Record]


@dataclass
class ShadowStatus:
    spec: dict[str, Any]
    windows: list[Record]


@dataclass
class RolloutStatus:
    journal: str
    id: int
    state: State
    state_doc: str
    stable: str
    canary: str
    desired_version: str
    weights: dict[str, int] | None
    weights_applied: bool
    step: int
    holds: int
    errors: int  # windows in a row whose evidence source failed (AnalysisSpec.consecutive_error_limit)
    reason: str
    created_at: str
    updated_at: str
    controller_pid: int | None
    controller: ControllerStatus
    abort_not_journaled: bool
    compares: list[dict[str, Any]]
    answer_checks: dict[str, Any]
    steps: list[StepStatus]
    shadow: ShadowStatus | None
    decisions: list[Record]
    weight_changes: list[Record]
    events: list[Record]
    drifts: int
    webhook_failures: int
    canary_adapter: dict[str, Any] | None  # --canary-adapter: its load state, serve line
    bake: BakeStatus | None = None  # --bake: the windows at 100% after the last step (bake.py)
    interruptions: list[Interruption] = field(default_factory=list)  # the controller's stops and resumes
    interrupted: Interruption | None = None  # the last stop, not resumed, with no controller running
    live: dict[str, Any] | None = None  # the router's weights now ({url, weights, error}) with no controller
    canary_down: str | None = None  # the router's reason, where its last judged window found the canary out of rotation

    @property
    def final(self) -> bool:
        return self.state.final




def _compares(spec: RolloutSpec) -> list[dict[str, Any]]:
    from qlift.rollout.checks import describe

    return list(describe(spec.analysis))


def answer_checks_run(spec: RolloutSpec) -> dict[str, Any]:
    """Where the answer checks (loops, language, refusals, schemas) can run under this spec, and why not."""
    from qlift.rollout.planes import PLANES

    split = PLANES[spec.data_plane].sees_answers and spec.provider == "builtin"
    shadow = spec.shadow is not None
    if split:
        note = "split windows and the shadow phase" if shadow else "split windows (the router's request log)"
    elif shadow:
        note = ("the shadow phase only (through the qlift router): the split windows' evidence "
                f"({spec.provider if spec.provider != 'builtin' else spec.data_plane}) carries no answers")
    else:
        note = (f"none: the {spec.data_plane} plane's evidence ({spec.provider}) carries status codes and timings, "
                "no answers; judge them before with qlift eval, or roll out behind the qlift router "
                "(--data-plane builtin) for answer checks and a shadow phase")
    return {"split_windows": split, "shadow": shadow, "note": note}


def last_down(windows: list[Record]) -> str | None:
    """Why the router kept the canary out of rotation at the end of the last judged window (None: it was in)."""
    return windows[-1]["canary"].get("down") if windows else None


def _judged(spec: RolloutSpec, weight: int, count: int) -> str:
    if weight == 100 and spec.bake:
        return f"then the bake: {spec.bake} window(s) at 100% judged against the stable's last figures (below)"
    if weight == 100:
        return "no window: the canary is promoted when this step's weights are applied (the last judged step " \
               "decided it)" if count > 1 else "no window: the canary is promoted at once"
    return (f"each {spec.interval:g}s window: canary vs stable at {weight}% on every check below, "
            f">= {spec.analysis.min_requests} canary requests, {spec.analysis.intervals_per_step} passing window(s)")


def rollout_status(journal_path: Path | None = None, rollout_id: int | None = None) -> RolloutStatus:
    """The journal's latest rollout (or ``rollout_id``), everything about it, its controller's stops and
    resumes, and, while no controller runs it, the weights the router holds now."""
    st = _journal_status(journal_path, rollout_id)
    st.interruptions = interruptions(st.events)
    if not st.final and not st.controller.alive:
        last = st.interruptions[-1] if st.interruptions else None
        st.interrupted = last if last is not None and last.resumed_at is None else None
        with Journal(Path(st.journal), readonly=True) as journal:
            st.live = live_weights(spec_of(journal.get(st.id)))
    return st


def _journal_status(journal_path: Path | None = None, rollout_id: int | None = None) -> RolloutStatus:
    """The journal's latest rollout (or ``rollout_id``), everything about it."""
    from qlift.rollout.adapter import adapter_status

    path = Path(journal_path or default_journal())
    with Journal(path, readonly=True) as journal:  # a missing journal: NotFoundError (exit 4)
        r = journal.latest() if rollout_id is None else journal.find(rollout_id)
        if r is None:
            raise NotFoundError(f"no rollout {rollout_id} in {path}" if rollout_id else f"no rollout in {path}",
                                hint="Leave out --rollout for the latest." if rollout_id else "Start one.")
        spec = spec_of(r)
        h = journal.history(r.id)
        last = journal.last_change(r.id)
        started = {s["idx"]: s for s in h["steps"]}
        steps = []
        for i, w in enumerate(r.steps):
            s = started.get(i, {})
            outcome = s.get("outcome")
            steps.append(StepStatus(i, w, s.get("started_at"), s.get("finished_at"),
                                    None if outcome is None else StepOutcome(outcome), _judged(spec, w, len(r.steps)),
                                    [win for win in h["windows"] if win["step"] == i]))
        latest = journal.latest()
        own = latest is not None and latest.id == r.id  # a controller runs the journal's latest rollout only
        pid = journal.controller_pid() if own else None
        age = journal.heartbeat_age() if own else None
        unjournaled_abort = journal.abort_marker.exists() and not r.state.final
        state = State.ABORT_REQUESTED if unjournaled_abort else r.state
        return RolloutStatus(
            journal=str(path), id=r.id, state=state, state_doc=DESCRIPTIONS[state], stable=r.stable, canary=r.canary,
            desired_version=r.desired_version, weights=last.weights if last else None,
            weights_applied=bool(last and last.applied_at), step=r.step, holds=r.holds, errors=r.errors,
            reason=r.reason, created_at=r.created_at, updated_at=r.updated_at, controller_pid=pid,
            controller=ControllerStatus(pid, pid is not None, None if age is None else round(age, 1),
                                        age is not None and age > max(HEARTBEAT_STALE_S, 3 * spec.interval)),
            abort_not_journaled=unjournaled_abort, compares=_compares(spec), answer_checks=answer_checks_run(spec),
            steps=steps,
            shadow=None if spec.shadow is None else ShadowStatus(
                spec.shadow.model_dump(mode="json"), [win for win in h["windows"] if win["step"] == SHADOW_STEP]),
            decisions=h["decisions"], weight_changes=h["weight_changes"], events=h["events"],
            drifts=sum(1 for e in h["events"] if e["kind"] == EventKind.DRIFT),
            webhook_failures=sum(1 for e in h["events"] if e["kind"] == EventKind.WEBHOOK_FAILED),
            canary_adapter=adapter_status(path, r.id),
            bake=bake_status(journal, r, spec, [win for win in h["windows"] if win["step"] == BAKE_STEP]),
            canary_down=last_down(h["windows"]))
