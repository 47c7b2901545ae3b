"""File-system helpers every stage uses: atomic outputs, hashing, sizes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, OutputExistsError

_CHUNK = 8 * 1024 * 1024


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 2) -> None:
    """Write ``data`` as JSON to ``path`` via a temp file and a rename: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def check_output_path(out: Path, *, force: bool) -> None:
    """Fail early, before any work, when ``out`` exists and ``force`` is off."""
    if out.exists() and not force:
        raise OutputExistsError(out)
    if not out.parent.exists():
        raise BadInputError(
            f"parent directory {out.parent} of the output does not exist",
            hint="Create it first or choose another -o path.",
        )


@contextlib.contextmanager
def atomic_output_dir(out: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temp dir beside ``out``; rename it to ``out`` only if the block succeeds.

    A failure or Ctrl-C removes the temp dir and leaves any existing ``out`` untouched.
    With ``force`` an existing ``out`` is replaced only after the new one is complete.
    """
    out = Path(out)
    check_output_path(out, force=force)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; an output dir should not be
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old: Path | None = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()


def copy_or_link(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` when on one file system, else copy it."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
