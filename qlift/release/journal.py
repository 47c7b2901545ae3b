"""The release journal: ``release.sqlite`` beside the outputs (WAL, synchronous=FULL).

A stage's row is written ``running`` before its work starts and ``done`` (with the output's
content hash) only after its output is in place, so a run killed at any point finds the stage
that did not finish and runs it again. Servers the release starts are recorded by pid, so a
resumed run stops the ones a killed run left behind.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError
from qlift.fsutil import lock_holder

NAME = "release.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS stages (
  name TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL, output TEXT NOT NULL DEFAULT '',
  content_hash TEXT NOT NULL DEFAULT '', result TEXT NOT NULL DEFAULT '{}', started_at TEXT NOT NULL,
  finished_at TEXT, files TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (name, key));
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY, file TEXT NOT NULL, started_at TEXT NOT NULL, finished_at TEXT,
  outcome TEXT NOT NULL DEFAULT 'running', detail TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS servers (
  pid INTEGER NOT NULL, stage TEXT NOT NULL, run_id INTEGER NOT NULL, url TEXT NOT NULL DEFAULT '',
  started_at TEXT NOT NULL, stopped_at TEXT, PRIMARY KEY (pid, run_id));
"""


def writer_lock_path(journal: Path) -> Path:
    """Held (flock, with its pid inside) by the one `release run` writing this journal, for its whole life."""
    return journal.with_name(journal.name + ".lock")


def run_outcome(journal: Path, last_run: dict[str, Any] | None) -> str | None:
    """The last run's outcome as it is: a run journaled `running` whose process is gone was killed."""
    if last_run is None:
        return None
    if last_run["outcome"] != "running":
        return str(last_run["outcome"])
    lock = writer_lock_path(journal)
    holder = lock_holder(lock)
    if holder is not None:
        return f"running (pid {holder})"
    try:
        pid = lock.read_text().strip()
    except OSError:
        pid = "?"
    return f"killed (pid {pid or '?'} gone); `qlift release run` resumes it"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ReleaseJournal:
    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        try:
            if readonly:
                self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.db = sqlite3.connect(self.path, isolation_level=None)
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=FULL")
                self.db.executescript(_SCHEMA)
                if "files" not in {r[1] for r in self.db.execute("PRAGMA table_info(stages)")}:  # an older journal
                    self.db.execute("ALTER TABLE stages ADD COLUMN files TEXT NOT NULL DEFAULT '{}'")
            self.db.execute("SELECT count(*) FROM stages").fetchone()
        except sqlite3.DatabaseError as exc:
            raise BadInputError(f"not a release journal ({exc})", path=self.path,
                                hint="Move it away; the next run starts a new journal.") from None
        self.db.row_factory = sqlite3.Row

    def __enter__(self) -> ReleaseJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.db.close()

    def start_run(self, file: Path) -> int:
        cur = self.db.execute("INSERT INTO runs (file, started_at) VALUES (?, ?)", (str(file), now()))
        return int(cur.lastrowid or 0)

    def finish_run(self, run_id: int, outcome: str, detail: str = "") -> None:
        self.db.execute("UPDATE runs SET finished_at=?, outcome=?, detail=? WHERE id=?", (now(), outcome, detail,
                                                                                           run_id))

    def stage(self, name: str, key: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT * FROM stages WHERE name=? AND key=?", (name, key)).fetchone()
        return _row(row)

    def latest(self, name: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT * FROM stages WHERE name=? ORDER BY started_at DESC, rowid DESC LIMIT 1",
                              (name,)).fetchone()
        return _row(row)

    def begin(self, name: str, key: str, output: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO stages (name, key, status, output, started_at) VALUES (?,?,?,?,?)",
                        (name, key, "running", output, now()))

    def end(self, name: str, key: str, status: str, *, content_hash: str = "", result: Any = None,
            files: dict[str, list[int]] | None = None) -> None:
        self.db.execute("UPDATE stages SET status=?, content_hash=?, result=?, finished_at=?, files=? "
                        "WHERE name=? AND key=?",
                        (status, content_hash, json.dumps(result or {}), now(), json.dumps(files or {}), name, key))

    def set_files(self, name: str, key: str, files: dict[str, list[int]]) -> None:
        """The output's file stats, after reading every byte proved it unchanged."""
        self.db.execute("UPDATE stages SET files=? WHERE name=? AND key=?", (json.dumps(files), name, key))

    def add_server(self, pid: int, stage: str, run_id: int, url: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO servers (pid, stage, run_id, url, started_at) VALUES (?,?,?,?,?)",
                        (pid, stage, run_id, url, now()))

    def server_stopped(self, pid: int) -> None:
        self.db.execute("UPDATE servers SET stopped_at=? WHERE pid=? AND stopped_at IS NULL", (now(), pid))

    def running_servers(self) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM servers WHERE stopped_at IS NULL").fetchall()
        return [dict(r) for r in rows]

    def last_run(self) -> dict[str, Any] | None:
        return _row(self.db.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone())


def _row(row: sqlite3.Row | None) -> dict[str, Any] | None:
    if row is None:
        return None
    out = dict(row)
    out["result"] = json.loads(out.get("result") or "{}")
    out["files"] = json.loads(out.get("files") or "{}")
    return out
