"""The rollout journal's file: opened for writing (created, WAL, synchronous=FULL) or read-only, and
checked before anything is written: a foreign SQLite file, a corrupted page (``PRAGMA quick_check``)
or a journal that cannot be written is refused with one line (exit 2), one a newer qlift wrote (its
``PRAGMA user_version`` above ``SCHEMA_VERSION``) with exit 6. ``Journal`` (journal.py) is this file's tables.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from qlift import schema_version
from qlift.errors import BadInputError, NotFoundError, QliftError

SCHEMA_VERSION = 1  # PRAGMA user_version: a journal of a newer one is refused (qlift.schema_version)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
  id INTEGER PRIMARY KEY, created_at TEXT NOT NULL, updated_at TEXT NOT NULL, state TEXT NOT NULL,
  stable TEXT NOT NULL, canary TEXT NOT NULL, spec TEXT NOT NULL, step INTEGER NOT NULL DEFAULT 0,
  holds INTEGER NOT NULL DEFAULT 0, passes INTEGER NOT NULL DEFAULT 0,
  desired_version TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', errors INTEGER NOT NULL DEFAULT 0);
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
CREATE TABLE IF NOT EXISTS carries (
  rollout_id INTEGER PRIMARY KEY, step INTEGER NOT NULL, kind TEXT NOT NULL, evidence TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS bake_baselines (
  rollout_id INTEGER PRIMARY KEY, window_id INTEGER, evidence TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY, rollout_id INTEGER NOT NULL, at TEXT NOT NULL, kind TEXT NOT NULL,
  detail TEXT NOT NULL DEFAULT '{}');
"""
_ROLLOUT_COLUMNS = {"id", "created_at", "updated_at", "state", "stable", "canary", "spec", "step", "holds", "passes",
                    "desired_version", "reason"}


def is_disk_full(exc: BaseException) -> bool:
    """SQLITE_FULL: the disk (or the file's page limit) has no room for the write."""
    return isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL




def _migrate(db: sqlite3.Connection) -> None:
    """Columns a journal written by an older qlift lacks (read-only, the rollout's defaults stand in)."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(rollouts)")}
    if "errors" not in columns:  # windows in a row without evidence (AnalysisSpec.consecutive_error_limit)
        db.execute("ALTER TABLE rollouts ADD COLUMN errors INTEGER NOT NULL DEFAULT 0")


class JournalFile:
    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly:
            self.db = self._open_readonly()
        else:
            self.db = self._open_for_writing()

    def _fail(self, what: str, hint: str = "Pass another --journal FILE.") -> BadInputError:
        return BadInputError(f"{self.path} {what}", hint=hint)

    def _configure(self, db: sqlite3.Connection) -> None:
        """Connection settings (a test caps max_page_count here to fill the journal)."""
        db.row_factory = sqlite3.Row

    def _open_for_writing(self) -> sqlite3.Connection:
        if self.path.is_dir():
            raise self._fail("is a directory, not a rollout journal")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._fail(f"cannot be created: {exc.strerror}") from None
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        if not fresh and not os.access(self.path, os.W_OK):
            raise self._fail("is read-only", hint="`qlift promote status` can read it; the other commands "
                             "need it writable (or pass another --journal FILE).")
        if not os.access(self.path.parent, os.W_OK):
            raise self._fail(f"cannot be written: its directory {self.path.parent} is read-only")
        db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0, check_same_thread=False)
        try:
            self._configure(db)
            self._check(db, fresh=fresh)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            _migrate(db)
            schema_version.stamp(db, SCHEMA_VERSION)
            db.execute("BEGIN IMMEDIATE")  # writable, and not locked by another writer forever
            db.execute("ROLLBACK")
        except QliftError:  # refused (another file, a newer schema): closed first
            db.close()
            raise
        except sqlite3.DatabaseError as exc:
            db.close()
            if is_disk_full(exc):
                raise self._fail("cannot be written: the disk is full", hint="Free disk space.") from None
            raise self._fail(f"cannot be used as a rollout journal: {exc}") from None
        return db

    def _open_readonly(self) -> sqlite3.Connection:
        if not self.path.is_file():
            raise NotFoundError(f"no rollout journal at {self.path}", hint="Start one with `qlift promote start`.")
        last: sqlite3.Error | None = None
        # mode=ro needs the -shm file or a writable directory; immutable=1 reads a file nobody may write.
        for query in ("mode=ro", "immutable=1"):
            db = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?{query}", uri=True, isolation_level=None,
                                 check_same_thread=False)
            try:
                self._configure(db)
                db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            except sqlite3.Error as exc:
                db.close()
                last = exc
                continue
            try:
                tables = self._check(db, fresh=False)
            except QliftError:
                db.close()
                raise
            if not tables:
                db.close()  # an empty file: a writer that has created it but not yet its tables, or nobody
                raise NotFoundError(f"no rollout in {self.path} yet: the journal has no tables",
                                    hint="A `qlift promote start` writing it adds them at once; else start one.")
            return db
        raise self._fail(f"cannot be read as a rollout journal: {last}")

    def _check(self, db: sqlite3.Connection, *, fresh: bool) -> set[str]:
        """Refuse a file that is not SQLite, is corrupted, or is someone else's database; its tables (none in a file
        not yet written, else ours)."""
        try:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not fresh or tables:
                problems = [r[0] for r in db.execute("PRAGMA quick_check").fetchall()]
                if problems != ["ok"]:
                    raise self._fail(f"is corrupted (PRAGMA quick_check: {problems[0]})",
                                     hint="Restore it from a copy, or pass another --journal FILE.")
        except sqlite3.DatabaseError as exc:
            raise self._fail(f"is not a usable SQLite file ({exc})") from None
        schema_version.check_readable(db, self.path, what="a rollout journal", supported=SCHEMA_VERSION)
        if not tables:
            return tables
        columns = {r[1] for r in db.execute("PRAGMA table_info(rollouts)")}
        if "rollouts" not in tables or not columns >= _ROLLOUT_COLUMNS:
            shown = ", ".join(sorted(tables)[:4])
            raise self._fail(f"is an SQLite file of something else (tables: {shown}), not a rollout journal")
        return tables

