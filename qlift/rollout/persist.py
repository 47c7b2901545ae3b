"""The one place a rollout's state is written: ``commit`` writes a ``Next`` (next_state.py) in one transaction,
with the weights it needs journaled as an intent first and applied after (``Journal.change_weights``); then
``announce`` tells the webhook once. The controller and every operator command go through here."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from qlift.rollout import carry
from qlift.rollout.journal import Journal, Rollout, now_iso
from qlift.rollout.next_state import Next
from qlift.rollout.states import State
from qlift.rollout.webhook import notify

Apply = Callable[[dict[str, int]], object]


def commit(journal: Journal, r: Rollout, nxt: Next, apply: Apply | None = None, *,
           allowed: tuple[State, ...] | None = None) -> bool:
    """Write ``nxt`` for rollout ``r`` if it is still in ``allowed`` (default: the state ``r`` was read in);
    False, changing nothing, when another process moved it meanwhile. ``apply`` sets the data plane's weights
    (needed where ``nxt`` changes them)."""
    allowed = allowed or (r.state,)
    nxt = nxt.naming_journal(journal.path)

    def writes(db: sqlite3.Connection) -> None:
        _write(journal, db, r, nxt, allowed)

    if nxt.weights is not None:
        if apply is None:
            raise ValueError("a decision that changes the weights needs the data plane's apply")
        return journal.change_weights(r.id, r.weights_for(nxt.weights.canary), nxt.weights.reason, apply,
                                      allowed_states=allowed, also=writes)
    with journal.tx() as db:
        if journal.get(r.id).state not in allowed:
            return False
        writes(db)
    return True


def _write(journal: Journal, db: sqlite3.Connection, r: Rollout, nxt: Next, allowed: tuple[State, ...]) -> None:
    w = nxt.window
    if w is not None:
        journal.judged(db, r.id, w.step, w.record, w.p_values, reason=nxt.decision_reason)
        journal.set_carry(db, r.id, None if w.carry is None else (w.carry[0], *carry.dump(w.carry[1])))
    elif nxt.clear_carry:
        journal.set_carry(db, r.id, None)
    if nxt.spec is not None:
        journal.set_spec(db, r.id, nxt.spec)
    if nxt.decision is not None:
        journal.decide(db, r.id, r.step, nxt.decision, nxt.reason, manual=nxt.manual)
    if nxt.step.finish is not None:
        journal.finish_step(db, r.id, r.step, nxt.step.finish)
    if nxt.step.start is not None:
        journal.start_step(db, r.id, *nxt.step.start)
    fields: dict[str, int | str] = {} if nxt.counters is None else dict(nxt.counters.fields())
    if nxt.position is not None:
        fields["step"] = nxt.position
    if nxt.desired_version is not None:
        fields["desired_version"] = nxt.desired_version
    if nxt.state != r.state:
        journal.transition(db, r.id, allowed, nxt.state, nxt.reason, **fields)
    elif fields:
        journal.update(db, r.id, **fields)
    if nxt.baseline is not None:
        journal.keep_baseline(db, r.id, r.step, carry.dump_version(nxt.baseline))


def announce(webhook: str | None, journal: Journal, r: Rollout, nxt: Next) -> str | None:
    """Tell ``webhook`` what was committed; why it failed, or None."""
    if not webhook or nxt.webhook is None:
        return None
    last = journal.last_change(r.id)
    weights = last.weights if last else None
    if nxt.manual:
        return notify(webhook, {"rollout": r.id, "at": now_iso(), "action": nxt.webhook, "state": nxt.state.value,
                                "reason": nxt.reason, "stable": r.stable, "canary": r.canary, "manual": True,
                                "weights": weights})
    return notify(webhook, {
        "rollout": r.id, "at": now_iso(), "stable": r.stable, "canary": r.canary, "action": nxt.webhook,
        "state": str(nxt.state), "step": r.step if nxt.webhook_step is None else nxt.webhook_step,
        "reason": nxt.reason, "p_values": nxt.p_values, "weights": weights,
    })
