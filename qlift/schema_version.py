"""The schema version of qlift's SQLite journals, kept in ``PRAGMA user_version``: a journal written by a newer
qlift is refused in one line naming its version, rather than misread by the code of an older one.

Bump a journal's version when what it writes could not be read right by the qlift before (a column whose
meaning changed, a table the older code must see); added columns with defaults do not need it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from qlift.errors import IncompatibleError


def written_by(db: sqlite3.Connection) -> int:
    """The version the file says it was written with (0: before qlift wrote one)."""
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def check_readable(db: sqlite3.Connection, path: Path, *, what: str, supported: int) -> None:
    """Refuse a journal of a newer schema than ``supported`` (exit 6)."""
    found = written_by(db)
    if found > supported:
        raise IncompatibleError(f"{path}: {what} of schema version {found}, newer than this qlift reads "
                                f"(up to {supported})", hint="Upgrade qlift to read or write it.")


def stamp(db: sqlite3.Connection, version: int) -> None:
    """Record ``version`` in a journal being written (an older one's lower version is raised to it)."""
    if written_by(db) < version:
        db.execute(f"PRAGMA user_version = {int(version)}")
