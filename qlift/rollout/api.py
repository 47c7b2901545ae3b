"""The library behind `qlift promote`: start (or resume) a rollout, and the control
operations another shell runs against the same journal."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, GateFailedError, QliftError
from qlift.rollout.journal import ACTIVE_STATES, FINAL_STATES, Journal, Rollout, now_iso
from qlift.rollout.spec import RolloutSpec
from qlift.settings import qlift_home

log = logging.getLogger(__name__)


def default_journal() -> Path:
    return qlift_home() / "rollouts" / "journal.sqlite"


def _spec_of(r: Rollout) -> RolloutSpec:
    return RolloutSpec.model_validate(r.spec)


def _eval_gate(spec: RolloutSpec, backend_urls: dict[str, str]) -> dict[str, Any] | None:
    if spec.eval_report is None:
        return None
    from qlift.rollout.evalgate import check_eval_report, served_model_dir

    model = spec.canary_model
    if model is None and spec.canary in backend_urls:
        model = served_model_dir(backend_urls[spec.canary])
    if model is None:
        raise BadInputError("cannot tell which model dir the canary serves (its /v1/models root is not a local dir)",
                            field="--canary-model", hint="Pass --canary-model DIR.")
    result = check_eval_report(spec.eval_report, model)
    log.info("eval report %s passed for the canary's model %s", spec.eval_report, model)
    return result


def run_controller(journal: Journal, r: Rollout) -> Rollout:
    from qlift.rollout.controller import Controller
    from qlift.rollout.dataplane import make_data_plane
    from qlift.rollout.sources import make_collector

    spec = _spec_of(r)
    plane = make_data_plane(spec)
    collector = make_collector(spec, plane.backend_urls())
    return Controller(journal, r.id, spec, plane, collector).run()


def start(spec: RolloutSpec, journal_path: Path | None = None) -> Rollout:
    """Run the rollout in the foreground until it is final; resume the journal's active one if any."""
    path = Path(journal_path or default_journal())
    with Journal(path) as journal, journal.controller_lock() as mine:
        if not mine:
            raise QliftError(f"a controller (pid {journal.controller_pid()}) is already running {path}",
                             hint="Watch it with `qlift promote status`, or stop it first.")
        active = journal.active()
        if active is not None:
            if (active.stable, active.canary) != (spec.stable, spec.canary):
                raise BadInputError(
                    f"{path} has rollout {active.id} of {active.canary} over {active.stable} in progress",
                    hint="Resume it with `qlift promote resume`, or `qlift promote abort` it first.")
            log.info("resuming rollout %d at step %d/%d (%s)", active.id, active.step + 1, len(active.steps),
                     active.state)
            return run_controller(journal, active)
        from qlift.rollout.dataplane import make_data_plane

        _eval_gate(spec, make_data_plane(spec).backend_urls())
        r = journal.create(spec.model_dump(mode="json"), spec.stable, spec.canary)
        log.info("rollout %d: %s over %s, steps %s, window %gs", r.id, spec.canary, spec.stable, spec.steps,
                 spec.interval)
        return run_controller(journal, r)


def _active(journal: Journal) -> Rollout:
    r = journal.latest()
    if r is None:
        raise QliftError(f"no rollout in {journal.path}", hint="Start one with `qlift promote start`.")
    if r.state in FINAL_STATES:
        raise QliftError(f"rollout {r.id} is already {r.state}")
    return r


def _switch(journal: Journal, r: Rollout, *, before: str, after: str, action: str, reason: str) -> None:
    """``before`` -> ``after``, the operator's decision journaled in the same transaction; any other state stays."""
    with journal.tx() as db:
        if journal.get(r.id).state == before:
            journal.update(db, r.id, state=after)
            journal.decide(db, r.id, r.step, action, reason, manual=True)


def pause(journal_path: Path | None = None) -> Rollout:
    with Journal(Path(journal_path or default_journal())) as journal:
        r = _active(journal)
        _switch(journal, r, before="progressing", after="paused", action="pause", reason="paused by an operator")
        return journal.get(r.id)


def resume(journal_path: Path | None = None) -> Rollout:
    """Set a paused rollout progressing; with no controller running, run one here (foreground)."""
    with Journal(Path(journal_path or default_journal())) as journal:
        r = _active(journal)
        _switch(journal, r, before="paused", after="progressing", action="resume",
                reason="resumed by an operator")
        with journal.controller_lock() as mine:
            if not mine:
                return journal.get(r.id)  # the running controller picks it up
            return run_controller(journal, journal.get(r.id))


def _finish_manually(journal_path: Path | None, *, action: str, to_canary: bool) -> Rollout:
    from qlift.rollout.dataplane import make_data_plane

    with Journal(Path(journal_path or default_journal())) as journal:
        r = _active(journal)
        state = "promoted" if to_canary else "aborted"
        reason = ("manual promotion: remaining analysis skipped" if to_canary
                  else "aborted by an operator: all traffic back to the stable")
        desired = r.canary if to_canary else r.stable
        last = len(r.steps) - 1

        def also(db: Any) -> None:
            journal.finish_step(db, r.id, r.step, state)
            journal.decide(db, r.id, r.step, action, reason, manual=True)
            journal.update(db, r.id, state=state, desired_version=desired, reason=reason,
                           **({"step": last} if to_canary else {}))

        spec = _spec_of(r)
        plane = make_data_plane(spec)
        if not journal.change_weights(r.id, r.weights_for(100 if to_canary else 0), reason, plane.set_weights,
                                      allowed_states=ACTIVE_STATES, also=also):
            raise QliftError(f"rollout {r.id} finished meanwhile ({journal.get(r.id).state})")
        from qlift.rollout.webhook import notify

        notify(spec.webhook, {"rollout": r.id, "at": now_iso(), "action": action, "state": state, "reason": reason,
                              "stable": r.stable, "canary": r.canary, "manual": True,
                              "weights": r.weights_for(100 if to_canary else 0)})
        return journal.get(r.id)


def abort(journal_path: Path | None = None) -> Rollout:
    """Weights back to 100% stable (journaled first), state aborted, the stable recorded as desired."""
    return _finish_manually(journal_path, action="abort", to_canary=False)


def promote_now(journal_path: Path | None = None) -> Rollout:
    """Skip the remaining analysis: 100% canary, state promoted, recorded as manual."""
    return _finish_manually(journal_path, action="promote", to_canary=True)


def status(journal_path: Path | None = None) -> dict[str, Any]:
    path = Path(journal_path or default_journal())
    if not path.exists():
        raise QliftError(f"no rollout journal at {path}", hint="Start one with `qlift promote start`.")
    with Journal(path) as journal:
        r = journal.latest()
        if r is None:
            raise QliftError(f"no rollout in {path}", hint="Start one with `qlift promote start`.")
        h = journal.history(r.id)
        last = journal.last_change(r.id)
        started = {s["idx"]: s for s in h["steps"]}
        steps = []
        for i, w in enumerate(r.steps):
            s = started.get(i, {})
            steps.append({"index": i, "weight": w, "started_at": s.get("started_at"),
                          "finished_at": s.get("finished_at"), "outcome": s.get("outcome"),
                          "windows": [win for win in h["windows"] if win["step"] == i]})
        return {
            "journal": str(path), "id": r.id, "state": r.state, "stable": r.stable, "canary": r.canary,
            "desired_version": r.desired_version, "weights": last.weights if last else None,
            "weights_applied": bool(last and last.applied_at), "step": r.step, "holds": r.holds,
            "reason": r.reason, "created_at": r.created_at, "updated_at": r.updated_at,
            "controller_pid": journal.controller_pid(), "steps": steps, "decisions": h["decisions"],
            "weight_changes": h["weight_changes"],
        }


def raise_for_outcome(r: Rollout) -> None:
    """Exit codes of `start`/`resume`: promoted 0, rolled back 10, aborted 1."""
    if r.state == "rolled_back":
        raise GateFailedError(f"rollout {r.id} rolled back: {r.reason}",
                              hint="See `qlift promote status` for the evidence.")
    if r.state == "aborted":
        raise QliftError(f"rollout {r.id} was aborted by an operator")
