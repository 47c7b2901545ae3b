"""The ``canary_adapters`` table (adapter.py): every load and unload of a `--canary-adapter`, journaled in the
rollout journal's own SQLite file as an intent before the server is touched and as done after."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qlift.errors import QliftError
from qlift.rollout.journal import Journal, now_iso
from qlift.rollout.states import ADAPTER_OPEN, AdapterState, can_move_adapter

_SCHEMA = """
CREATE TABLE IF NOT EXISTS canary_adapters (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, path TEXT NOT NULL, server TEXT NOT NULL,
  content_hash TEXT NOT NULL, base_dir TEXT, base_name TEXT, state TEXT NOT NULL, rollout_id INTEGER,
  created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
"""
_COLUMNS_ADDED = {"restart_argv": "TEXT"}  # journals written before these columns get them on open


@dataclass
class AdapterRecord:
    id: int
    name: str
    path: str
    server: str
    content_hash: str
    base_dir: str | None
    base_name: str | None
    state: AdapterState
    rollout_id: int | None
    created_at: str
    updated_at: str
    restart_argv: str | None = None  # restart_command() once promoted, as JSON

    def __post_init__(self) -> None:
        self.state = AdapterState(self.state)

    def serve_command(self) -> list[str]:
        """`qlift serve` with this adapter: what reproduces the promoted state after a restart (the one
        journaled at the promotion, with the server's port, recipe and other adapters, where there is one)."""
        from qlift.serve.lora import serve_command

        if self.restart_argv:
            return [str(a) for a in json.loads(self.restart_argv)]
        return serve_command(Path(self.base_dir or "BASE_DIR"), {self.name: Path(self.path)},
                             served_name=self.base_name, runtime=True)




class AdapterJournal:
    """The ``canary_adapters`` table beside the rollout journal's own tables (same file, WAL)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            Journal(self.path).close()  # the rollout tables first: a file of only this table is not a journal
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)
        have = {r["name"] for r in self.db.execute("PRAGMA table_info(canary_adapters)")}
        for column, kind in _COLUMNS_ADDED.items():
            if column not in have:
                self.db.execute(f"ALTER TABLE canary_adapters ADD COLUMN {column} {kind}")

    def close(self) -> None:
        self.db.close()

    def open_records(self) -> list[AdapterRecord]:
        marks = ", ".join("?" for _ in ADAPTER_OPEN)
        rows = self.db.execute(f"SELECT * FROM canary_adapters WHERE state IN ({marks}) ORDER BY id",
                               ADAPTER_OPEN).fetchall()
        return [AdapterRecord(**dict(r)) for r in rows]

    def for_rollout(self, rollout_id: int) -> AdapterRecord | None:
        row = self.db.execute("SELECT * FROM canary_adapters WHERE rollout_id = ? ORDER BY id DESC LIMIT 1",
                              (rollout_id,)).fetchone()
        return None if row is None else AdapterRecord(**dict(row))

    def add(self, *, name: str, path: Path, server: str, content_hash: str, base_dir: str | None,
            base_name: str | None, rollout_id: int | None) -> AdapterRecord:
        t = now_iso()
        cur = self.db.execute(
            "INSERT INTO canary_adapters (name, path, server, content_hash, base_dir, base_name, state, rollout_id,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (name, str(path), server, content_hash, base_dir, base_name, AdapterState.LOADING, rollout_id, t, t))
        return self.get(int(cur.lastrowid or 0))

    def get(self, rid: int) -> AdapterRecord:
        return AdapterRecord(**dict(self.db.execute("SELECT * FROM canary_adapters WHERE id = ?", (rid,)).fetchone()))

    def move(self, rec: AdapterRecord, state: AdapterState) -> AdapterRecord:
        """The record's next state, checked against states.ADAPTER_TRANSITIONS (a final one is never left)."""
        if not can_move_adapter(rec.state, state):
            raise QliftError(f"adapter record {rec.id} ({rec.name}): {rec.state} -> {state} is not a valid "
                             "transition")
        return self._set(rec, state=state)

    def keep_command(self, rec: AdapterRecord, argv: list[str]) -> AdapterRecord:
        return self._set(rec, restart_argv=json.dumps(argv))

    def link(self, rec: AdapterRecord, rollout_id: int) -> AdapterRecord:
        return self._set(rec, rollout_id=rollout_id)

    def _set(self, rec: AdapterRecord, **fields: Any) -> AdapterRecord:
        fields["updated_at"] = now_iso()
        cols = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(f"UPDATE canary_adapters SET {cols} WHERE id = ?", (*fields.values(), rec.id))
        return self.get(rec.id)


@contextlib.contextmanager
def adapter_journal(path: Path) -> Iterator[AdapterJournal]:
    aj = AdapterJournal(path)
    try:
        yield aj
    finally:
        aj.close()


def read_adapter(journal_path: Path, rollout_id: int) -> AdapterRecord | None:
    """Rollout ``rollout_id``'s latest adapter record, read-only (as `status` reads the journal): None for a
    journal without the table, or without such a record."""
    from urllib.parse import quote

    if not Path(journal_path).is_file():
        return None
    db = sqlite3.connect(f"file:{quote(str(Path(journal_path).resolve()))}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        row = db.execute("SELECT * FROM canary_adapters WHERE rollout_id = ? ORDER BY id DESC LIMIT 1",
                         (rollout_id,)).fetchone()
    except sqlite3.Error:
        row = None
    finally:
        db.close()
    return None if row is None else AdapterRecord(**dict(row))
