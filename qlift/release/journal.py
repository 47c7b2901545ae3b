"""The release journal: ``release.sqlite`` beside the outputs (WAL, synchronous=FULL).

A stage's row is written ``running`` before its work starts and ``done`` (with the output's
content hash) only after its output is in place, so a run killed at any point finds the stage
that did not finish and runs it again. Servers the release starts are recorded by pid, so a
resumed run stops the ones a killed run left behind.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TypedDict

from pydantic import JsonValue

from qlift import schema_version
from qlift.errors import BadInputError
from qlift.fsutil import lock_holder

NAME = "release.sqlite"
SCHEMA_VERSION = 1  # PRAGMA user_version: a journal of a newer one is refused (qlift.schema_version)
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


class StageStatus(StrEnum):
    """A stage row's status, as the journal stores it."""

    RUNNING = "running"  # written before its work starts
    DONE = "done"  # its output is in place (file stages: with its content hash)
    FAILED = "failed"


class RunOutcome(StrEnum):
    """A run's outcome, as the journal stores it (``running`` until it ends). ``killed`` is never written: it is
    how ``run_outcome`` reads a ``running`` run whose process is gone."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    KILLED = "killed"


@dataclass(frozen=True)
class StageRow:
    """A stage's journaled row, typed as it is read back."""

    name: str
    key: str
    status: StageStatus
    output: str
    content_hash: str
    result: dict[str, JsonValue]  # what the stage's run kept of it (JSON)
    started_at: str
    finished_at: str | None
    files: dict[str, list[int]]


class ServerRow(TypedDict):
    """A server's journaled row: a vLLM server or router a run started, by pid (``stopped_at`` None: it runs)."""

    pid: int
    stage: str
    run_id: int
    url: str
    started_at: str
    stopped_at: str | None


@dataclass(frozen=True)
class RunRow:
    """A run's journaled row, typed as it is read back (its fields in the table's order: status prints them)."""

    id: int
    file: str
    started_at: str
    finished_at: str | None
    outcome: RunOutcome
    detail: str


def writer_lock_path(journal: Path) -> Path:
    """Held (flock, with its pid inside) by the one `release run` writing this journal, for its whole life."""
    return journal.with_name(journal.name + ".lock")


def run_outcome(journal: Path, run: RunRow) -> tuple[RunOutcome, str]:
    """The run's outcome as it is, and as status says it: a run journaled `running` whose process is gone was
    killed."""
    if run.outcome is not RunOutcome.RUNNING:
        return run.outcome, run.outcome.value
    lock = writer_lock_path(journal)
    holder = lock_holder(lock)
    if holder is not None:
        return RunOutcome.RUNNING, f"running (pid {holder})"
    try:
        pid = lock.read_text().strip()
    except OSError:
        pid = "?"
    return RunOutcome.KILLED, f"killed (pid {pid or '?'} gone); `qlift release run` resumes it"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ReleaseJournal:
    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        try:
            if readonly:
                self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
                schema_version.check_readable(self.db, self.path, what="a release journal", supported=SCHEMA_VERSION)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # check_same_thread off: `release run` starts its servers in threads that journal each pid
                # (``live.Processes`` holds a lock around every such write).
                self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                schema_version.check_readable(self.db, self.path, what="a release journal", supported=SCHEMA_VERSION)
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=FULL")
                self.db.executescript(_SCHEMA)
                if "files" not in {r[1] for r in self.db.execute("PRAGMA table_info(stages)")}:  # an older journal
                    self.db.execute("ALTER TABLE stages ADD COLUMN files TEXT NOT NULL DEFAULT '{}'")
                schema_version.stamp(self.db, SCHEMA_VERSION)
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

    def finish_run(self, run_id: int, outcome: RunOutcome, detail: str = "") -> None:
        outcome = RunOutcome(outcome)
        if outcome not in (RunOutcome.DONE, RunOutcome.FAILED):
            raise ValueError(f"a run ends done or failed, not {outcome}")
        self.db.execute("UPDATE runs SET finished_at=?, outcome=?, detail=? WHERE id=?",
                        (now(), outcome.value, detail, run_id))

    def stage(self, name: str, key: str) -> StageRow | None:
        row = self.db.execute("SELECT * FROM stages WHERE name=? AND key=?", (name, key)).fetchone()
        return _stage_row(row)

    def latest(self, name: str) -> StageRow | None:
        row = self.db.execute("SELECT * FROM stages WHERE name=? ORDER BY started_at DESC, rowid DESC LIMIT 1",
                              (name,)).fetchone()
        return _stage_row(row)

    def begin(self, name: str, key: str, output: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO stages (name, key, status, output, started_at) VALUES (?,?,?,?,?)",
                        (name, key, StageStatus.RUNNING.value, output, now()))

    def end(self, name: str, key: str, status: StageStatus, *, content_hash: str = "",
            result: Mapping[str, JsonValue] | None = None,
            files: dict[str, list[int]] | None = None) -> None:
        status = StageStatus(status)
        if status is StageStatus.RUNNING:
            raise ValueError("a stage ends done or failed; `begin` journals it running")
        self.db.execute("UPDATE stages SET status=?, content_hash=?, result=?, finished_at=?, files=? "
                        "WHERE name=? AND key=?",
                        (status.value, content_hash, json.dumps(result or {}), now(), json.dumps(files or {}), name,
                         key))

    def settle(self, name: str, key: str, status: StageStatus, result: Mapping[str, JsonValue]) -> None:
        """A stage's outcome as learnt after its run (its rollout finished outside the release); its times stay."""
        self.db.execute("UPDATE stages SET status=?, result=?, finished_at=coalesce(finished_at, ?) "
                        "WHERE name=? AND key=?", (StageStatus(status).value, json.dumps(result), now(), name, key))

    def settle_run(self, run_id: int, outcome: RunOutcome, detail: str) -> None:
        """A run's outcome as learnt after it ended (its rollout finished outside the release)."""
        outcome = RunOutcome(outcome)
        if outcome not in (RunOutcome.DONE, RunOutcome.FAILED):
            raise ValueError(f"a run ends done or failed, not {outcome}")
        self.db.execute("UPDATE runs SET outcome=?, detail=?, finished_at=coalesce(finished_at, ?) WHERE id=?",
                        (outcome.value, detail, now(), run_id))

    def set_files(self, name: str, key: str, files: dict[str, list[int]]) -> None:
        """The output's file stats, after reading every byte proved it unchanged."""
        self.db.execute("UPDATE stages SET files=? WHERE name=? AND key=?", (json.dumps(files), name, key))

    def add_server(self, pid: int, stage: str, run_id: int, url: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO servers (pid, stage, run_id, url, started_at) VALUES (?,?,?,?,?)",
                        (pid, stage, run_id, url, now()))

    def server_stopped(self, pid: int) -> None:
        self.db.execute("UPDATE servers SET stopped_at=? WHERE pid=? AND stopped_at IS NULL", (now(), pid))

    def running_servers(self) -> list[ServerRow]:
        rows = self.db.execute("SELECT * FROM servers WHERE stopped_at IS NULL").fetchall()
        return [_server_row(r) for r in rows]

    def servers(self, run_id: int) -> list[ServerRow]:
        """Every server a run started (stopped ones too), in the order it started them."""
        rows = self.db.execute("SELECT * FROM servers WHERE run_id=? ORDER BY started_at, rowid", (run_id,)).fetchall()
        return [_server_row(r) for r in rows]

    def last_run(self) -> RunRow | None:
        row = self.db.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            return None
        return RunRow(id=int(row["id"]), file=row["file"], started_at=row["started_at"],
                      finished_at=row["finished_at"], outcome=RunOutcome(row["outcome"]), detail=row["detail"])


def _server_row(row: sqlite3.Row) -> ServerRow:
    return ServerRow(pid=int(row["pid"]), stage=row["stage"], run_id=int(row["run_id"]), url=row["url"],
                     started_at=row["started_at"], stopped_at=row["stopped_at"])


def _stage_row(row: sqlite3.Row | None) -> StageRow | None:
    """A stage's row with its status as the enum and its JSON columns read."""
    if row is None:
        return None
    return StageRow(name=row["name"], key=row["key"], status=StageStatus(row["status"]), output=row["output"],
                    content_hash=row["content_hash"], result=json.loads(row["result"] or "{}"),
                    started_at=row["started_at"], finished_at=row["finished_at"],
                    files=json.loads(row["files"] or "{}"))
