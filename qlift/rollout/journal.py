"""The rollout journal: one SQLite file (WAL, synchronous=FULL) that the controller and the
control commands share.

It holds each rollout (state, versions, spec, current step), every step, every analysis
window with its evidence and decision, every decision with time and reason, and every
weight change. A weight change is committed as an *intent* before the data plane is
touched and marked applied after; a controller killed in between finds the intent on
restart and applies it again, so the data plane never holds weights the journal does not
know. A file lock serialises weight changes between processes (controller, abort, promote).

States move only through ``transition`` (checked against states.TRANSITIONS in the same
transaction). The file is checked before anything is written: a foreign SQLite file, a
corrupted page (``PRAGMA quick_check``) or a journal that cannot be written is refused with
one line (exit 2); ``readonly=True`` reads a journal nobody may write (``status``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qlift.errors import QliftError
from qlift.fsutil import file_lock, lock_holder
from qlift.rollout.journal_file import JournalFile, is_disk_full
from qlift.rollout.states import DecisionAction, EventKind, State, StepOutcome, can_move

ACTIVE_STATES = tuple(s for s in State if s.active)

def default_journal() -> Path:
    from qlift.settings import qlift_home

    return qlift_home() / "rollouts" / "journal.sqlite"


def journal_flag(path: Path | str | None) -> str:
    """`` --journal PATH`` for a hint's command, so it acts on the journal the command was given ('' for the
    default one)."""
    import shlex

    if path is None or Path(path).expanduser().absolute() == default_journal().expanduser().absolute():
        return ""
    return f" --journal {shlex.quote(str(path))}"


def with_journal(text: str, path: Path | str | None) -> str:
    """Every `qlift promote CMD ...` quoted in ``text`` with `` --journal PATH`` (unless it has one), so a hint
    printed for a journal other than the default acts on that journal as printed."""
    import re

    flag = journal_flag(path)
    if not flag or not text or "--journal FILE" in text:  # a hint about which journal to pass: as it is
        return text
    return re.sub(r"`(qlift promote [a-z]+[^`]*)`",
                  lambda m: m.group(0) if "--journal" in m.group(1) else f"`{m.group(1)}{flag}`", text)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class Rollout:
    id: int
    created_at: str
    updated_at: str
    state: State
    stable: str
    canary: str
    spec: dict[str, Any]
    step: int
    holds: int
    passes: int
    desired_version: str
    reason: str
    errors: int = 0  # windows in a row whose evidence source failed (not in a journal of an older qlift)

    def __post_init__(self) -> None:
        self.state = State(self.state)

    @property
    def steps(self) -> list[int]:
        return [int(w) for w in self.spec["steps"]]

    def weights_for(self, canary_weight: int) -> dict[str, int]:
        return {self.stable: 100 - canary_weight, self.canary: canary_weight}


@dataclass
class WeightChange:
    id: int
    rollout_id: int
    weights: dict[str, int]
    reason: str
    journaled_at: str
    applied_at: str | None


class Journal(JournalFile):
    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed (and fsynced) on leaving the block."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:  # SQLite may have rolled back itself (SQLITE_FULL)
                self.db.execute("ROLLBACK")
            raise

    def _flock(self, suffix: str, *, wait: bool = True) -> contextlib.AbstractContextManager[bool]:
        return file_lock(Path(f"{self.path}{suffix}"), wait=wait)

    def weights_lock(self) -> contextlib.AbstractContextManager[bool]:
        return self._flock(".weights.lock")

    def controller_lock(self) -> contextlib.AbstractContextManager[bool]:
        """Held by the one running controller for its whole life (non-blocking: False when taken)."""
        return self._flock(".controller.lock", wait=False)

    def controller_pid(self) -> int | None:
        """pid of the controller holding the lock, or None when no controller runs."""
        pid = lock_holder(Path(f"{self.path}.controller.lock"))
        return pid if pid is not None and pid > 0 else None

    def heartbeat(self) -> None:
        """The running controller marks itself alive (the lock file's mtime; no journal write)."""
        with contextlib.suppress(OSError):
            os.utime(f"{self.path}.controller.lock")

    def heartbeat_age(self) -> float | None:
        """Seconds since the controller's last heartbeat, None when no controller runs."""
        if self.controller_pid() is None:
            return None
        try:
            return max(0.0, time.time() - os.stat(f"{self.path}.controller.lock").st_mtime)
        except OSError:
            return None

    @property
    def abort_marker(self) -> Path:
        """Written when an abort reached the data plane but the journal was full: the controller obeys it."""
        return Path(f"{self.path}.abort-requested")

    # -- reading ---------------------------------------------------------------------

    @staticmethod
    def _rollout(row: sqlite3.Row) -> Rollout:
        d = dict(row)
        d["spec"] = json.loads(d["spec"])
        return Rollout(**d)

    def get(self, rollout_id: int) -> Rollout:
        r = self.find(rollout_id)
        if r is None:
            raise QliftError(f"rollout {rollout_id} is not in {self.path}")
        return r

    def position(self, rollout_id: int) -> tuple[State, int]:
        """(state, step) alone: what a controller re-reads every tick."""
        row = self.db.execute("SELECT state, step FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        if row is None:
            raise QliftError(f"rollout {rollout_id} is not in {self.path}")
        return State(row[0]), int(row[1])

    def find(self, rollout_id: int) -> Rollout | None:
        row = self.db.execute("SELECT * FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        return None if row is None else self._rollout(row)

    def latest(self) -> Rollout | None:
        row = self.db.execute("SELECT * FROM rollouts ORDER BY id DESC LIMIT 1").fetchone()
        return None if row is None else self._rollout(row)

    def active(self) -> Rollout | None:
        r = self.latest()
        return r if r is not None and r.state.active else None

    def last_change(self, rollout_id: int) -> WeightChange | None:
        row = self.db.execute("SELECT * FROM weight_changes WHERE rollout_id = ? ORDER BY id DESC LIMIT 1",
                              (rollout_id,)).fetchone()
        if row is None:
            return None
        d = dict(row)
        d["weights"] = json.loads(d["weights"])
        return WeightChange(**d)

    def history(self, rollout_id: int) -> dict[str, Any]:
        """Steps, windows, decisions and weight changes of one rollout, for `status`."""
        q = self.db.execute

        def rows(sql: str) -> list[dict[str, Any]]:
            return [dict(r) for r in q(sql, (rollout_id,)).fetchall()]

        windows = rows("SELECT * FROM windows WHERE rollout_id = ? ORDER BY id")
        for w in windows:
            for key in ("stable", "canary", "checks", "notes"):
                w[key] = json.loads(w[key])
        decisions = rows("SELECT * FROM decisions WHERE rollout_id = ? ORDER BY id")
        for d in decisions:
            d["p_values"] = json.loads(d["p_values"])
            d["manual"] = bool(d["manual"])
        changes = rows("SELECT * FROM weight_changes WHERE rollout_id = ? ORDER BY id")
        for c in changes:
            c["weights"] = json.loads(c["weights"])
        events = rows("SELECT * FROM events WHERE rollout_id = ? ORDER BY id") if self._has_events() else []
        for e in events:
            e["detail"] = json.loads(e["detail"])
        return {"steps": rows("SELECT * FROM steps WHERE rollout_id = ? ORDER BY idx"),
                "windows": windows, "decisions": decisions, "weight_changes": changes, "events": events}

    def last_event(self, rollout_id: int, kinds: tuple[EventKind, ...]) -> dict[str, Any] | None:
        """The detail of the rollout's latest event of one of ``kinds``, None when there is none."""
        if not self._has_events():
            return None
        marks = ", ".join("?" * len(kinds))
        row = self.db.execute(f"SELECT detail FROM events WHERE rollout_id = ? AND kind IN ({marks}) ORDER BY id DESC"
                              " LIMIT 1", (rollout_id, *kinds)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def _has_events(self) -> bool:
        """A journal written by an older qlift, read read-only, has no events table."""
        return self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone() is not None

    # -- writing ---------------------------------------------------------------------

    def create(self, spec: dict[str, Any], stable: str, canary: str, *,
               state: State = State.PROGRESSING) -> Rollout:
        t = now_iso()
        with self.tx() as db:
            if self.active() is not None:
                raise QliftError("a rollout is already in progress in this journal")
            cur = db.execute(
                "INSERT INTO rollouts (created_at, updated_at, state, stable, canary, spec, desired_version)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)", (t, t, state.value, stable, canary, json.dumps(spec), stable))
            rid = int(cur.lastrowid or 0)
            db.execute("INSERT INTO decisions (rollout_id, at, step, action, reason) VALUES (?, ?, 0, ?, ?)",
                       (rid, t, DecisionAction.START.value, f"rollout of {canary} over {stable} started"))
        return self.get(rid)

    def decide(self, db: sqlite3.Connection, rollout_id: int, step: int, action: DecisionAction, reason: str, *,
               manual: bool = False) -> None:
        """A decision that judged no window (start, an operator's command, a promotion, a paused canary)."""
        db.execute("INSERT INTO decisions (rollout_id, at, step, action, reason, manual) VALUES (?, ?, ?, ?, ?, ?)",
                   (rollout_id, now_iso(), step, str(action), reason, int(manual)))

    def judged(self, db: sqlite3.Connection, rollout_id: int, step: int, record: dict[str, Any],
               p_values: dict[str, float], *, reason: str | None = None) -> int:
        """A judged window (``record``, see ``add_window``) and the decision taken on it: the record's action,
        for ``reason`` (default: the record's). Returns the window's id."""
        wid = self.add_window(db, rollout_id, step, record)
        db.execute("INSERT INTO decisions (rollout_id, at, step, action, reason, window_id, p_values)"
                   " VALUES (?, ?, ?, ?, ?, ?, ?)", (rollout_id, now_iso(), step, str(record["action"]),
                                                     record["reason"] if reason is None else reason, wid,
                                                     json.dumps(p_values)))
        return wid

    def transition(self, db: sqlite3.Connection, rollout_id: int, src: State | tuple[State, ...], dst: State,
                   reason: str, **fields: Any) -> bool:
        """Move the rollout from ``src`` (one state or any of several) to ``dst`` inside ``db``'s
        transaction, with ``fields``; False, changing nothing, when it is in none of ``src`` now.
        A move the transition table lacks is a bug, and raises."""
        sources = src if isinstance(src, tuple) else (src,)
        now = self.get(rollout_id).state
        if now not in sources:
            return False
        if not can_move(now, dst):
            raise QliftError(f"rollout {rollout_id}: {now.value} -> {dst.value} is not a valid transition")
        self._set(db, rollout_id, state=dst.value, reason=reason, **fields)
        self.event(db, rollout_id, EventKind.STATE, {"from": now.value, "to": dst.value, "reason": reason})
        return True

    def set_carry(self, db: sqlite3.Connection, rollout_id: int, held: tuple[int, str, str] | None) -> None:
        """The analysis's held evidence (step, kind, JSON: carry.py), or none, with the decision that set it."""
        if held is None:
            db.execute("DELETE FROM carries WHERE rollout_id = ?", (rollout_id,))
        else:
            db.execute("INSERT OR REPLACE INTO carries (rollout_id, step, kind, evidence) VALUES (?, ?, ?, ?)",
                       (rollout_id, *held))

    def carry(self, rollout_id: int) -> tuple[int, str, str] | None:
        row = self.db.execute("SELECT step, kind, evidence FROM carries WHERE rollout_id = ?",
                              (rollout_id,)).fetchone()
        return None if row is None else (int(row[0]), str(row[1]), str(row[2]))

    def keep_baseline(self, db: sqlite3.Connection, rollout_id: int, step: int, evidence: str) -> None:
        """The stable's evidence (JSON: carry.py) of ``step``'s last judged window, kept for the bake."""
        row = db.execute("SELECT max(id) FROM windows WHERE rollout_id = ? AND step = ?", (rollout_id, step)).fetchone()
        db.execute("INSERT OR REPLACE INTO bake_baselines (rollout_id, window_id, evidence) VALUES (?, ?, ?)",
                   (rollout_id, row[0] if row else None, evidence))

    def baseline(self, rollout_id: int) -> tuple[str, str | None, str | None] | None:
        """The kept stable evidence (JSON) and the start and end of the window it is from; None when none was
        kept (or the journal, read-only and written by an older qlift, has no such table)."""
        if self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'bake_baselines'").fetchone() is None:
            return None
        row = self.db.execute("SELECT b.evidence, w.started_at, w.ended_at FROM bake_baselines b LEFT JOIN "
                              "windows w ON w.id = b.window_id WHERE b.rollout_id = ?", (rollout_id,)).fetchone()
        return None if row is None else (str(row[0]), row[1], row[2])

    def event(self, db: sqlite3.Connection, rollout_id: int, kind: EventKind, detail: dict[str, Any]) -> None:
        db.execute("INSERT INTO events (rollout_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                   (rollout_id, now_iso(), str(kind), json.dumps(detail)))

    def log_event(self, rollout_id: int, kind: EventKind, detail: dict[str, Any]) -> bool:
        """One event in its own transaction; False (not raised) when the journal is full."""
        try:
            with self.tx() as db:
                self.event(db, rollout_id, kind, detail)
        except sqlite3.OperationalError as exc:
            if is_disk_full(exc):
                return False
            raise
        return True

    def set_spec(self, db: sqlite3.Connection, rollout_id: int, spec: dict[str, Any]) -> None:
        """The rollout's spec, where `start` changed its options mid-rollout (with the decision naming them)."""
        self._set(db, rollout_id, spec=json.dumps(spec))

    def update(self, db: sqlite3.Connection, rollout_id: int, **fields: Any) -> None:
        """Counters and fields of the rollout row; the state only through ``transition``."""
        if "state" in fields:
            raise QliftError(f"rollout {rollout_id}: the state moves only through Journal.transition "
                             "(checked against states.TRANSITIONS), not update")
        self._set(db, rollout_id, **fields)

    def _set(self, db: sqlite3.Connection, rollout_id: int, **fields: Any) -> None:
        fields["updated_at"] = now_iso()
        cols = ", ".join(f"{k} = ?" for k in fields)
        db.execute(f"UPDATE rollouts SET {cols} WHERE id = ?", (*fields.values(), rollout_id))

    def start_step(self, db: sqlite3.Connection, rollout_id: int, idx: int, weight: int) -> None:
        db.execute("INSERT OR IGNORE INTO steps (rollout_id, idx, weight, started_at) VALUES (?, ?, ?, ?)",
                   (rollout_id, idx, weight, now_iso()))

    def finish_step(self, db: sqlite3.Connection, rollout_id: int, idx: int, outcome: StepOutcome) -> None:
        db.execute("UPDATE steps SET finished_at = ?, outcome = ? WHERE rollout_id = ? AND idx = ?"
                   " AND finished_at IS NULL", (now_iso(), outcome, rollout_id, idx))

    def add_window(self, db: sqlite3.Connection, rollout_id: int, step: int, record: dict[str, Any]) -> int:
        cur = db.execute(
            "INSERT INTO windows (rollout_id, step, started_at, ended_at, source, stable, canary, action, reason,"
            " checks, notes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rollout_id, step, record["started_at"], record["ended_at"], record["source"],
             json.dumps(record["stable"]), json.dumps(record["canary"]), record["action"], record["reason"],
             json.dumps(record["checks"]), json.dumps(record.get("notes", []))))
        return int(cur.lastrowid or 0)

    def change_weights(
        self,
        rollout_id: int,
        weights: dict[str, int],
        reason: str,
        apply: Callable[[dict[str, int]], object],
        *,
        allowed_states: tuple[State, ...] = ACTIVE_STATES,
        also: Callable[[sqlite3.Connection], None] | None = None,
    ) -> bool:
        """Journal ``weights`` (with ``also``'s writes, in the same transaction), then apply them.

        Returns False, changing nothing, when the rollout is no longer in ``allowed_states``
        (another process aborted or promoted it meanwhile).
        """
        with self.weights_lock():
            with self.tx() as db:
                if self.get(rollout_id).state not in allowed_states:
                    return False
                cur = db.execute("INSERT INTO weight_changes (rollout_id, weights, reason, journaled_at)"
                                 " VALUES (?, ?, ?, ?)", (rollout_id, json.dumps(weights), reason, now_iso()))
                change_id = int(cur.lastrowid or 0)
                if also is not None:
                    also(db)
            apply(weights)
            self.mark_applied(change_id)
        return True

    def mark_applied(self, change_id: int) -> None:
        with self.tx() as db:
            db.execute("UPDATE weight_changes SET applied_at = ? WHERE id = ?", (now_iso(), change_id))

    def reapply_pending(self, rollout_id: int, apply: Callable[[dict[str, int]], object]) -> WeightChange | None:
        """After a crash: apply the last journaled weights if they were never marked applied."""
        with self.weights_lock():
            last = self.last_change(rollout_id)
            if last is None or last.applied_at is not None:
                return None
            apply(last.weights)
            self.mark_applied(last.id)
        return last
