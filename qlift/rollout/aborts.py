"""Aborts: the 100% stable weights journaled (``abort_requested``), applied, then confirmed ``aborted``.

`qlift promote abort`, `resume` and `start` (api.py) and a running controller (controller.py) all go
through here, so an abort the data plane did not confirm, or one applied while the journal was full
(a marker file beside it), is finished by whichever runs next.
"""

from __future__ import annotations

import logging
import sqlite3

from qlift.errors import ExternalToolError, QliftError
from qlift.rollout.dataplane import DataPlane, mirror_source
from qlift.rollout.journal import Journal, Rollout, is_disk_full
from qlift.rollout.next_state import abort_confirmed, abort_requested
from qlift.rollout.persist import commit
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.states import RUNNING, State

log = logging.getLogger(__name__)


def spec_of(r: Rollout) -> RolloutSpec:
    return RolloutSpec.model_validate(r.spec)


def converge(journal: Journal, r: Rollout, plane: DataPlane) -> Rollout:
    """Bring the data plane to what the journal says before anything else: an abort the journal
    could not record (full disk) or the plane did not confirm, and a final state's weights that
    never reached the plane. Raises when the plane still cannot be reached."""
    if journal.abort_marker.exists() and not journal_marked_abort(journal, r, plane):
        raise QliftError(f"the journal {journal.path} is still full: the abort is applied but not journaled",
                         hint="Free disk space, then run `qlift promote abort` again.")
    r = journal.get(r.id)
    if r.state == State.ABORT_REQUESTED:
        return confirm_abort(journal, r, plane)
    if r.state.final:
        pending = journal.reapply_pending(r.id, plane.set_weights)
        if pending is not None:
            log.info("applied rollout %d's journaled weights %s (%s)", r.id, pending.weights, pending.reason)
    return journal.get(r.id)


ABORT_REASON = "aborted by an operator: all traffic back to the stable"


def shadow_off(spec: RolloutSpec, plane: DataPlane) -> None:
    """A rollout with a shadow phase that ends (aborted, promoted by hand) turns the plane's mirroring off."""
    try:
        mirror = mirror_source(plane, spec)  # None without a shadow phase
        if mirror is not None:
            mirror.stop()
    except QliftError as exc:
        log.warning("could not turn the router's shadow mirroring off: %s", exc.one_line())


def request_abort(journal: Journal, r: Rollout, plane: DataPlane, reason: str = ABORT_REASON) -> Rollout:
    """Journal ``abort_requested`` with the 100% stable weights in one transaction, then apply and confirm.
    Raises ExternalToolError, the abort staying requested, when the data plane does not take them."""
    try:
        done = commit(journal, r, abort_requested(r.stable, reason), plane.set_weights)
    except QliftError as exc:
        raise _unconfirmed(r, exc) from None
    if not done:  # the controller moved meanwhile: start over from what the journal says now
        now = journal.get(r.id)
        if now.state.final or now.state == State.ABORT_REQUESTED:
            return confirm_abort(journal, now, plane) if now.state == State.ABORT_REQUESTED else now
        return request_abort(journal, now, plane, reason)
    return confirm_abort(journal, journal.get(r.id), plane)


def _unconfirmed(r: Rollout, exc: QliftError) -> ExternalToolError:
    return ExternalToolError(
        f"rollout {r.id}'s abort is journaled (abort_requested) but the data plane did not confirm 100% "
        f"{r.stable}: {exc.message}",
        hint="Run `qlift promote abort` again once it answers (a running controller retries too).", tool="data plane")


def confirm_abort(journal: Journal, r: Rollout, plane: DataPlane) -> Rollout:
    """Apply 100% stable (again) and, once the plane took it, move abort_requested -> aborted."""
    stable = r.weights_for(0)
    try:
        with journal.weights_lock():
            plane.set_weights(stable)
    except QliftError as exc:
        raise _unconfirmed(r, exc) from None
    last = journal.last_change(r.id)
    if last is not None and last.weights == stable and last.applied_at is None:
        journal.mark_applied(last.id)
    commit(journal, r, abort_confirmed(), allowed=(State.ABORT_REQUESTED,))
    shadow_off(spec_of(r), plane)
    return journal.get(r.id)


def journal_marked_abort(journal: Journal, r: Rollout, plane: DataPlane) -> bool:
    """An abort applied while the journal was full: journal it now. False while the journal is still full."""
    marker = journal.abort_marker
    if not marker.exists():
        return True
    try:
        r = journal.get(r.id)
        if r.state in RUNNING or r.state == State.PAUSED:
            request_abort(journal, r, plane, reason="aborted by an operator while the journal was full: 100% stable "
                          "applied first, journaled when space returned")
        elif r.state == State.ABORT_REQUESTED:
            confirm_abort(journal, r, plane)
    except sqlite3.OperationalError as exc:
        if is_disk_full(exc):
            return False
        raise
    marker.unlink(missing_ok=True)
    return True


def abort_with_full_journal(journal: Journal, r: Rollout, plane: DataPlane) -> Rollout:
    """No room to journal the abort: a marker file (no data blocks) that the controller obeys and the next abort
    journals, then the weights (restoring them needs no journal write), both under the weights lock: a running
    controller's reconcile, which takes that lock too, finds the marker and leaves 100% stable standing (with the
    marker written after, it could set the journal's canary weights again in between)."""
    with journal.weights_lock():
        try:
            journal.abort_marker.touch()
        except OSError as exc:
            log.warning("could not write %s either (%s): a running controller may set the canary's weights again",
                        journal.abort_marker, exc.strerror)
        plane.set_weights(r.weights_for(0))
    shadow_off(spec_of(r), plane)
    log.warning("the journal %s is full: the data plane has 100%% %s now, but the abort is not journaled yet. "
                "Free disk space, then run `qlift promote abort` again to journal it", journal.path, r.stable)
    return r


