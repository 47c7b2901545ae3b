"""When the release trusts a finished stage's output without reading it.

The journal keeps, beside a finished stage's content hash, each file of its output with its size,
mtime, inode and ctime as they were once the output was in place. A later run reuses the output
unread only when its files are exactly those, with those four numbers: an edit in place changes
the ctime even when size and mtime are put back, a copy changes the inode. Otherwise every byte
is read again (the digests in ``qlift.json`` are not used: they are trusted on size and mtime
alone) and the result compared with the journaled hash; when it matches, the files' stat is
journaled anew, so the next check is a ``stat`` per file again.
"""

from __future__ import annotations

from pathlib import Path

from qlift import lineage
from qlift.errors import QliftError

FileStats = dict[str, list[int]]


def file_stats(out: Path) -> FileStats:
    """Each file under ``out`` (``qlift.json`` too): [size, mtime_ns, inode, ctime_ns]."""
    stats: FileStats = {}
    for p in sorted(out.rglob("*")):
        if p.is_file():
            st = p.stat()
            stats[p.relative_to(out).as_posix()] = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
    return stats


def verified_stats(out: Path, content_hash: str, journaled: FileStats) -> FileStats | None:
    """``out``'s file stats now when it is still the output journaled with ``content_hash`` (unread when they
    equal ``journaled``, else after reading every byte); None when it is incomplete or its content changed."""
    if not content_hash or not (out / lineage.MANIFEST_NAME).is_file():
        return None
    try:
        now = file_stats(out)
        if now == journaled:
            return now
        return now if lineage.content_hash(lineage.hash_files(out)) == content_hash else None
    except (OSError, QliftError):
        return None
