"""The library behind `qlift promote`: start (or resume) a rollout, and the control
operations another shell runs against the same journal.

Inputs are checked before anything is journaled (the journal's integrity and writability,
the webhook URL, the version names against the data plane). Every state change goes
through ``Journal.transition``. An abort is journaled as ``abort_requested`` with its 100%
stable weights, applied, then confirmed ``aborted``: when the data plane cannot be reached
it stays requested, and `abort`, `resume`, `start` and a running controller retry it.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlift import settings
from qlift.errors import BadInputError, GateFailedError, NotFoundError, QliftError
from qlift.rollout import next_state, preflight, train
from qlift.rollout.aborts import (
    abort_with_full_journal,
    converge,
    request_abort,
    shadow_off,
    spec_of,
)
from qlift.rollout.dataplane import DataPlane, NamesModels, check_stable_up, check_versions
from qlift.rollout.journal import Journal, Rollout, default_journal, is_disk_full, journal_flag, now_iso
from qlift.rollout.options_change import apply_options
from qlift.rollout.persist import announce, commit
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.states import RUNNING, EventKind, State
from qlift.rollout.webhook import WebhookAction, notify, validate_webhook

if TYPE_CHECKING:
    from qlift.rollout.adapter import AdapterRecord

log = logging.getLogger(__name__)

def status(journal_path: Path | None = None, rollout_id: int | None = None) -> dict[str, Any]:
    """What `status --json` prints, as plain JSON values (the typed form: ``status.rollout_status``)."""
    from qlift.rollout.status import rollout_status
    from qlift.serialize import to_jsonable

    out: dict[str, Any] = to_jsonable(rollout_status(journal_path, rollout_id))
    return out


def make_plane(spec: RolloutSpec, router_token: str | None) -> DataPlane:
    from qlift.rollout import dataplane

    return dataplane.make_data_plane(spec, router_token=router_token)


def _eval_gate(spec: RolloutSpec, backend_urls: dict[str, str],
               backend_models: dict[str, str] | None = None) -> dict[str, Any] | None:
    if spec.eval_report is None:
        return None
    from qlift.rollout.evalgate import check_eval_report, served_model_dir

    if spec.canary_hash is not None:
        result = check_eval_report(spec.eval_report, canary_hash=spec.canary_hash)
        log.info("eval report %s passed for the canary's model %s", spec.eval_report, spec.canary_hash)
        return result
    model = spec.canary_model
    if model is None and spec.canary in backend_urls:
        # A version on a multi-LoRA server is (URL, model name): look that model up, not the server's first.
        model = served_model_dir(backend_urls[spec.canary], (backend_models or {}).get(spec.canary))
    if model is None:
        raise BadInputError("cannot tell which model dir the canary serves (its /v1/models root is not a local dir)",
                            field="--canary-model", hint="Pass --canary-model DIR.")
    result = check_eval_report(spec.eval_report, model)
    log.info("eval report %s passed for the canary's model %s", spec.eval_report, model)
    return result


def validate_spec(spec: RolloutSpec) -> None:
    """What can be checked without the data plane beyond the spec's own validators: the webhook URL."""
    validate_webhook(spec.webhook)


def run_controller(journal: Journal, r: Rollout, *, router_token: str | None,
                   plane: DataPlane | None = None) -> Rollout:
    from qlift.rollout.controller import Controller
    from qlift.rollout.interruptions import journaled_life
    from qlift.rollout.sources import make_collector

    spec = spec_of(r)
    plane = plane or make_plane(spec, router_token)
    collector = make_collector(spec, plane.backend_urls(), router_token=router_token)
    with journaled_life(journal, r.id):  # a stop (SIGTERM, Ctrl-C, an error) and a resume are journaled events
        return Controller(journal, r.id, spec, plane, collector).run()  # the mirror, where any, is the plane's


def start(spec: RolloutSpec, journal_path: Path | None = None, *, new: bool = False,
          allow_stable_down: bool = False, force: bool = False, spec_file: Path | None = None,
          router_token: str | None = None, next_version: train.NextVersion | None = None,
          allow_small_windows: bool = False) -> Rollout:
    """Run the rollout in the foreground until it is final; resume the journal's active one if any. A new
    rollout is refused while the data plane reports the stable down, unless ``allow_stable_down``; one whose
    live weights or shadow are not the starting state (or a resumed one's not its journal's), unless ``force``;
    and one whose canary does not answer (preflight.py). ``router_token``: the router's admin token (None:
    QLIFT_ROUTER_TOKEN's), as every control operation here takes it. ``next_version``: the canary's backend, added
    to the router before a new rollout's checks (train.py: `start --next`)."""
    token = settings.router_token(router_token)
    path = Path(journal_path or default_journal())
    validate_spec(spec)
    with _nothing_left_if_refused(path), Journal(path) as journal, journal.controller_lock() as mine:
        if not mine:
            changed = _options_to_running(journal, spec)
            if changed is not None:
                return changed  # its running controller judges the next window with them
            raise QliftError(f"a controller (pid {journal.controller_pid()}) is already running {path}",
                             hint=f"Watch it with `qlift promote status{journal_flag(path)}`, or stop it first.")
        latest = journal.latest()
        if latest is not None and (journal.abort_marker.exists() or not (latest.state in RUNNING
                                                                         or latest.state == State.PAUSED)):
            latest = converge(journal, latest, make_plane(spec_of(latest), token))
        active = journal.active()
        if active is not None:
            if (active.stable, active.canary) != (spec.stable, spec.canary):
                raise BadInputError(
                    f"{path} has rollout {active.id} of {active.canary} over {active.stable} in progress",
                    hint=f"Resume it with `qlift promote resume{journal_flag(path)}`, or "
                         f"`qlift promote abort{journal_flag(path)}` it first.")
            active = apply_options(journal, active, spec, resume_to=_paused_from(journal, active))
            log.info("resuming rollout %d at step %d/%d (%s)", active.id, active.step + 1, len(active.steps),
                     active.state)
            resumed_plane = make_plane(spec_of(active), token)
            preflight.check_resume_state(resumed_plane, journal, active, force=force)
            return run_controller(journal, active, router_token=token, plane=resumed_plane)
        if latest is not None and latest.state in (State.PROMOTED, State.FINISHED) and not new:
            raise BadInputError(
                f"rollout {latest.id} in {path} already promoted {latest.canary} (it has 100% of the traffic); "
                f"a new rollout would move weights back to {spec.canary} {spec.steps[0]}%",
                hint=f"Pass --new to start another rollout, or `qlift promote status{journal_flag(path)}` to see "
                     "the last one.")
        plane = make_plane(spec, token)
        with train.next_backend(journal, spec, next_version, token) as journal_added:  # a refusal retires it
            check_versions(plane, [spec.stable, spec.canary])
            check_stable_up(plane, spec.stable, allow_down=allow_stable_down)
            preflight.check_start_state(plane, spec, journal, journal_path, force=force, spec_file=spec_file)
            preflight.check_canary_serves(plane, spec)
            preflight.check_window_sizing(spec, token, allow_small=allow_small_windows)
            _eval_gate(spec, plane.backend_urls(), plane.backend_models() if isinstance(plane, NamesModels) else None)
            first = State.SHADOWING if spec.shadow is not None else State.PROGRESSING
            r = journal.create(spec.model_dump(mode="json"), spec.stable, spec.canary, state=first)
            journal_added(r)
        log.info("rollout %d: %s over %s, steps %s, window %gs%s", r.id, spec.canary, spec.stable, spec.steps,
                 spec.interval, " after a shadow phase" if first == State.SHADOWING else "")
        return run_controller(journal, r, router_token=token, plane=plane)


def _paused_from(journal: Journal, r: Rollout) -> State | None:
    return paused_from(journal, r) if r.state == State.PAUSED else None


def _options_to_running(journal: Journal, spec: RolloutSpec) -> Rollout | None:
    """The journal's active rollout of these versions with the options ``spec`` gives that differ applied, for
    the controller running it to pick up; None where none differ (or no such rollout is active)."""
    active = journal.active()
    if active is None or (active.stable, active.canary) != (spec.stable, spec.canary):
        return None
    changed = apply_options(journal, active, spec, resume_to=_paused_from(journal, active))
    return None if changed is active else changed


@contextlib.contextmanager
def _nothing_left_if_refused(path: Path) -> Iterator[None]:
    """A refused `start` leaves nothing behind: the journal files (and folders) it created, where it journaled no
    rollout, are removed again."""
    made = [p for p in (path, *(Path(f"{path}{s}") for s in ("-wal", "-shm", ".controller.lock", ".weights.lock")))
            if not p.exists()]
    folders = [d for d in path.parents if not d.exists()]
    try:
        yield
    except BaseException:
        if path in made and path.exists():
            with contextlib.suppress(QliftError, sqlite3.Error), Journal(path, readonly=True) as journal:
                if journal.latest() is None:
                    for p in made:
                        p.unlink(missing_ok=True)
                    for d in folders:
                        with contextlib.suppress(OSError):
                            d.rmdir()
        raise


def _existing_journal(journal_path: Path | None) -> Path:
    """The journal a control command (pause, resume, abort, promote) acts on: never created here, where it would
    hold no rollout to act on."""
    path = Path(journal_path or default_journal())
    if not path.exists():
        raise NotFoundError(f"no rollout journal at {path}",
                            hint="Pass the --journal FILE `qlift promote start` wrote, or start one.")
    return path


def _latest(journal: Journal) -> Rollout:
    r = journal.latest()
    if r is None:
        raise NotFoundError(f"no rollout in {journal.path}",
                         hint=f"Start one with `qlift promote start{journal_flag(journal.path)}` and its --router, "
                         "--stable and --canary (or -f SPEC).")
    return r


def _not_final(journal: Journal, r: Rollout) -> None:
    if r.state.final:
        raise QliftError(f"rollout {r.id} is already {r.state}")


def pause(journal_path: Path | None = None) -> Rollout:
    with Journal(_existing_journal(journal_path)) as journal:
        r = _latest(journal)
        _not_final(journal, r)
        commit(journal, r, next_state.operator_pause(), allowed=tuple(RUNNING))
        return journal.get(r.id)


def paused_from(journal: Journal, r: Rollout) -> State:
    """The state a paused rollout left (shadowing or progressing), from its transition events."""
    for e in reversed(journal.history(r.id)["events"]):
        if e["kind"] == EventKind.STATE and e["detail"].get("to") == State.PAUSED:
            return State(e["detail"]["from"])
    return State.PROGRESSING


def resume(journal_path: Path | None = None, *, router_token: str | None = None) -> Rollout:
    """Set a paused rollout going again (an unconfirmed abort: retry it); with no controller running,
    run one here (foreground)."""
    with Journal(_existing_journal(journal_path)) as journal:
        r = _latest(journal)
        spec, token = spec_of(r), settings.router_token(router_token)
        if journal.abort_marker.exists() or r.state == State.ABORT_REQUESTED or r.state.final:
            r = converge(journal, r, make_plane(spec, token))
            if r.state.final:
                train.settle(journal.path, token)  # a `--next` rollout's end that a killed process left unsettled
            _not_final(journal, r)
        if r.state == State.PAUSED:
            back = paused_from(journal, r)
            commit(journal, r, next_state.operator_resume(back))
        with journal.controller_lock() as mine:
            if not mine:
                return journal.get(r.id)  # the running controller picks it up
            final = run_controller(journal, journal.get(r.id), router_token=token)
        from qlift.rollout.adapter import settle

        settle(journal.path)  # a --canary-adapter of a rollout now rolled back or aborted is unloaded
        train.settle(journal.path, token)  # and a `--next` rollout's unserved version retired from the router
        return final


# -- abort and manual promotion ---------------------------------------------------------------


def abort(journal_path: Path | None = None, *, router_token: str | None = None) -> Rollout:
    """Weights back to 100% stable (journaled first), state aborted once the data plane confirms."""
    with Journal(_existing_journal(journal_path)) as journal:
        r = _latest(journal)
        plane = make_plane(spec_of(r), settings.router_token(router_token))
        try:
            if journal.abort_marker.exists() or r.state.final or r.state == State.ABORT_REQUESTED:
                done = converge(journal, r, plane)
                if r.state.final:  # it was final before: nothing to abort (its weights now confirmed)
                    _not_final(journal, done)
                final = done
            else:
                final = request_abort(journal, r, plane)
        except sqlite3.OperationalError as exc:
            if not is_disk_full(exc):
                raise
            return abort_with_full_journal(journal, journal.get(r.id), plane)
        notify(spec_of(r).webhook, {"rollout": r.id, "at": now_iso(), "action": WebhookAction.ABORT,
                                     "state": final.state, "reason": final.reason, "stable": r.stable,
                                     "canary": r.canary, "manual": True, "weights": r.weights_for(0)})
        from qlift.rollout.adapter import settle

        settle(journal.path)  # a --canary-adapter it loaded is unloaded once the weights are back on the stable
        train.settle(journal.path, settings.router_token(router_token))  # a `--next` canary leaves the router
        return final


def promote_now(journal_path: Path | None = None, *, router_token: str | None = None) -> Rollout:
    """Skip the remaining analysis: 100% canary, state promoted, recorded as manual."""
    with Journal(_existing_journal(journal_path)) as journal:
        r = _latest(journal)
        _not_final(journal, r)
        if r.state == State.ABORT_REQUESTED:
            raise QliftError(f"rollout {r.id} has an abort requested",
                             hint=f"Run `qlift promote abort{journal_flag(journal.path)}` to finish it.")
        spec = spec_of(r)
        plane = make_plane(spec, settings.router_token(router_token))
        nxt = next_state.operator_promote(r.canary, len(r.steps) - 1)
        if not commit(journal, r, nxt, plane.set_weights):
            raise QliftError(f"rollout {r.id} changed meanwhile ({journal.get(r.id).state})",
                             hint=f"See `qlift promote status{journal_flag(journal.path)}`, then try again.")
        shadow_off(spec, plane)
        announce(spec.webhook, journal, r, nxt)
        train.settle(journal.path, settings.router_token(router_token))  # a `--next` rollout's old stable goes
        return journal.get(r.id)


def finish(journal_path: Path | None = None, *, router_token: str | None = None) -> Rollout:
    """`qlift promote finish`: the stable of a baked rollout released (``bake.finish``), and for a `--next`
    rollout retired from the router (or a retirement a killed process left, settled)."""
    from qlift.rollout.bake import finish as release_stable

    path = Path(journal_path or default_journal())
    token = settings.router_token(router_token)
    train.settle(path, token)
    final = release_stable(path)
    train.settle(path, token)
    return final


# -- --canary-adapter -----------------------------------------------------------------------


def start_with_adapter(spec: RolloutSpec, journal_path: Path | None, name: str, path: Path,
                       router_token: str | None = None, **start_options: Any) -> tuple[Rollout, AdapterRecord | None]:
    """`qlift promote start --canary-adapter NAME=DIR`: load, roll out, then unload or keep.
    ``start_options`` go to ``qlift.rollout.api.start``."""
    from qlift.rollout.adapter import AdapterState, finish, prepare, resolve_target

    token = settings.router_token(router_token)
    journal_path = Path(journal_path or default_journal())
    if spec.eval_report is not None and spec.canary_model is None and spec.canary_hash is None:
        # The gate with the base included, before anything loads; `start`'s own gate then sees the adapter dir.
        from qlift.rollout.evalgate import check_eval_report

        target = resolve_target(spec, name, router_token=token)
        check_eval_report(spec.eval_report, Path(path), target.base_dir)
        spec = spec.model_copy(update={"canary_model": Path(path).resolve()})
    prepare(spec, journal_path, name, path, router_token=token)
    final = start(spec, journal_path, router_token=token, **start_options)
    rec = finish(journal_path, final)
    if rec is not None and rec.state == AdapterState.KEPT:
        from qlift.serve.lora import command_line

        log.info("adapter %s promoted on %s; after a restart serve it with: %s", rec.name, rec.server,
                 command_line(rec.serve_command()))
    return final, rec


def raise_for_outcome(r: Rollout, journal_path: Path | None = None) -> None:
    """Exit codes of `start`/`resume`: promoted 0, rolled back 10, aborted 1 (the hint names ``journal_path``)."""
    if r.state == State.ROLLED_BACK:
        raise GateFailedError(f"rollout {r.id} rolled back: {r.reason}",
                              hint=f"See `qlift promote status{journal_flag(journal_path)}` for the evidence.")
    if r.state in (State.ABORTED, State.ABORT_REQUESTED):
        raise QliftError(f"rollout {r.id} was aborted by an operator")
