"""The rollout journal: one SQLite file (WAL, synchronous=FULL) that the controller and the
control commands share.

It holds each rollout (state, versions, spec, current step), every step, every analysis
window with its evidence and decision, every decision with time and reason, and every
weight change. A weight change is committed as an *intent* before the data plane is
touched and marked applied after; a controller killed in between finds the intent on
restart and applies it again, so the data plane never holds weights the journal does not
know. A file lock serialises weight changes between processes (controller, abort, promote).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, QliftError

ACTIVE_STATES = ("progressing", "paused")
FINAL_STATES = ("promoted", "rolled_back", "aborted")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
  id INTEGER PRIMARY KEY, created_at TEXT NOT NULL, updated_at TEXT NOT NULL, state TEXT NOT NULL,
  stable TEXT NOT NULL, canary TEXT NOT NULL, spec TEXT NOT NULL, step INTEGER NOT NULL DEFAULT 0,
  holds INTEGER NOT NULL DEFAULT 0, passes INTEGER NOT NULL DEFAULT 0,
  desired_version TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS steps (
  rollout_id INTEGER NOT NULL, idx INTEGER NOT NULL, weight INTEGER NOT NULL, started_at TEXT NOT NULL,
  finished_at TEXT, outcome TEXT, PRIMARY KEY (rollout_id, idx));
CREATE TABLE IF NOT EXISTS windows (
  id INTEGER PRIMARY KEY, rollout_id INTEGER NOT NULL, step INTEGER NOT NULL, started_at TEXT NOT NULL,
  ended_at TEXT NOT NULL, source TEXT NOT NULL, stable TEXT NOT NULL, canary TEXT NOT NULL,
  action TEXT NOT NULL, reason TEXT NOT NULL, checks TEXT NOT NULL, notes TEXT NOT NULL DEFAULT '[]');
CREATE TABLE IF NOT EXISTS decisions (
  id INTEGER PRIMARY KEY, rollout_id INTEGER NOT NULL, at TEXT NOT NULL, step INTEGER NOT NULL,
  action TEXT NOT NULL, reason TEXT NOT NULL, manual INTEGER NOT NULL DEFAULT 0, window_id INTEGER,
  p_values TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS weight_changes (
  id INTEGER PRIMARY KEY, rollout_id INTEGER NOT NULL, weights TEXT NOT NULL, reason TEXT NOT NULL,
  journaled_at TEXT NOT NULL, applied_at TEXT);
"""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class Rollout:
    id: int
    created_at: str
    updated_at: str
    state: str
    stable: str
    canary: str
    spec: dict[str, Any]
    step: int
    holds: int
    passes: int
    desired_version: str
    reason: str

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


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0, check_same_thread=False)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise BadInputError(f"cannot use {self.path} as a rollout journal: {exc}",
                                hint="Pass another --journal FILE.") from None

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
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    @contextlib.contextmanager
    def _flock(self, suffix: str, *, wait: bool = True) -> Iterator[bool]:
        fd = os.open(f"{self.path}{suffix}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            yield True
        finally:
            os.close(fd)  # closing releases the lock; so does dying, even by SIGKILL

    def weights_lock(self) -> contextlib.AbstractContextManager[bool]:
        return self._flock(".weights.lock")

    def controller_lock(self) -> contextlib.AbstractContextManager[bool]:
        """Held by the one running controller for its whole life (non-blocking: False when taken)."""
        return self._flock(".controller.lock", wait=False)

    def controller_pid(self) -> int | None:
        """pid of the controller holding the lock, or None when no controller runs."""
        with self._flock(".controller.lock", wait=False) as free:
            if free:
                return None
        try:
            return int(Path(f"{self.path}.controller.lock").read_text() or 0) or None
        except (OSError, ValueError):
            return None

    # -- reading ---------------------------------------------------------------------

    @staticmethod
    def _rollout(row: sqlite3.Row) -> Rollout:
        d = dict(row)
        d["spec"] = json.loads(d["spec"])
        return Rollout(**d)

    def get(self, rollout_id: int) -> Rollout:
        row = self.db.execute("SELECT * FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        if row is None:
            raise QliftError(f"rollout {rollout_id} is not in {self.path}")
        return self._rollout(row)

    def latest(self) -> Rollout | None:
        row = self.db.execute("SELECT * FROM rollouts ORDER BY id DESC LIMIT 1").fetchone()
        return None if row is None else self._rollout(row)

    def active(self) -> Rollout | None:
        r = self.latest()
        return r if r is not None and r.state in ACTIVE_STATES else None

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
        return {"steps": rows("SELECT * FROM steps WHERE rollout_id = ? ORDER BY idx"),
                "windows": windows, "decisions": decisions, "weight_changes": changes}

    # -- writing ---------------------------------------------------------------------

    def create(self, spec: dict[str, Any], stable: str, canary: str) -> Rollout:
        t = now_iso()
        with self.tx() as db:
            if self.active() is not None:
                raise QliftError("a rollout is already in progress in this journal")
            cur = db.execute(
                "INSERT INTO rollouts (created_at, updated_at, state, stable, canary, spec, desired_version)"
                " VALUES (?, ?, 'progressing', ?, ?, ?, ?)", (t, t, stable, canary, json.dumps(spec), stable))
            rid = int(cur.lastrowid or 0)
            db.execute("INSERT INTO decisions (rollout_id, at, step, action, reason) VALUES (?, ?, 0, 'start', ?)",
                       (rid, t, f"rollout of {canary} over {stable} started"))
        return self.get(rid)

    def decide(self, db: sqlite3.Connection, rollout_id: int, step: int, action: str, reason: str, *,
               manual: bool = False, window_id: int | None = None, p_values: dict[str, float] | None = None) -> None:
        db.execute("INSERT INTO decisions (rollout_id, at, step, action, reason, manual, window_id, p_values)"
                   " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (rollout_id, now_iso(), step, action, reason, int(manual), window_id, json.dumps(p_values or {})))

    def update(self, db: sqlite3.Connection, rollout_id: int, **fields: Any) -> None:
        fields["updated_at"] = now_iso()
        cols = ", ".join(f"{k} = ?" for k in fields)
        db.execute(f"UPDATE rollouts SET {cols} WHERE id = ?", (*fields.values(), rollout_id))

    def start_step(self, db: sqlite3.Connection, rollout_id: int, idx: int, weight: int) -> None:
        db.execute("INSERT OR IGNORE INTO steps (rollout_id, idx, weight, started_at) VALUES (?, ?, ?, ?)",
                   (rollout_id, idx, weight, now_iso()))

    def finish_step(self, db: sqlite3.Connection, rollout_id: int, idx: int, outcome: str) -> None:
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
        allowed_states: tuple[str, ...] = ACTIVE_STATES,
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
            with self.tx() as db:
                db.execute("UPDATE weight_changes SET applied_at = ? WHERE id = ?", (now_iso(), change_id))
        return True

    def reapply_pending(self, rollout_id: int, apply: Callable[[dict[str, int]], object]) -> WeightChange | None:
        """After a crash: apply the last journaled weights if they were never marked applied."""
        with self.weights_lock():
            last = self.last_change(rollout_id)
            if last is None or last.applied_at is not None:
                return None
            apply(last.weights)
            with self.tx() as db:
                db.execute("UPDATE weight_changes SET applied_at = ? WHERE id = ?", (now_iso(), last.id))
        return last
