"""``qlift.lock.json``: where a download came from and every file's size and sha256; and
``verify``, which re-hashes a directory against it offline."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qlift import progress
from qlift.errors import BadInputError, NotFoundError
from qlift.fsutil import FileHashes, contained, hash_threads, write_json_atomic
from qlift.lineage import MANIFEST_NAME, utc_now
from qlift.loaders import read_json_object

LOCK_NAME = "qlift.lock.json"
LOCK_SCHEMA = 1


# A repo may carry files under the names qlift writes (any qlift output pushed to a hub):
# they are kept, byte for byte, under this folder instead of being overwritten.
UPSTREAM_DIR = "qlift-upstream"


@dataclass
class LockedFile:
    path: str  # where the file is in the download
    size: int
    sha256: str
    repo_path: str | None = None  # where it is in the repo, when that differs


def local_path(repo_path: str) -> str:
    """Where a repo file lands in the download: its own path, unless qlift writes that name."""
    return f"{UPSTREAM_DIR}/{repo_path}" if repo_path in (LOCK_NAME, MANIFEST_NAME) else repo_path


@dataclass
class Lock:
    source: str
    endpoint: str
    repo: str
    revision: str
    commit: str
    files: list[LockedFile]
    created_at: str = field(default_factory=utc_now)
    schema: int = LOCK_SCHEMA

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def write_lock(directory: Path, lock: Lock) -> Path:
    target = Path(directory) / LOCK_NAME
    data = asdict(lock)
    for f in data["files"]:
        if f["repo_path"] is None:
            del f["repo_path"]
    write_json_atomic(target, data)
    return target


def read_lock(directory: Path) -> Lock:
    path = Path(directory) / LOCK_NAME
    if not path.is_file():
        raise NotFoundError(
            f"{directory} has no {LOCK_NAME}",
            hint="verify checks directories written by `qlift download`; download it again to get a lockfile.",
        )
    try:
        data: dict[str, Any] = read_json_object(path, hint="Restore the lockfile or download again.")
        files = [LockedFile(str(f["path"]), int(f["size"]), str(f["sha256"]),
                            str(f["repo_path"]) if f.get("repo_path") else None) for f in data["files"]]
        for f in files:
            contained(Path(directory), f.path, source=path)
        return Lock(
            source=str(data["source"]), endpoint=str(data["endpoint"]), repo=str(data["repo"]),
            revision=str(data["revision"]), commit=str(data["commit"]), files=files,
            created_at=str(data.get("created_at", "")), schema=int(data.get("schema", LOCK_SCHEMA)),
        )
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise BadInputError(f"malformed lockfile ({type(exc).__name__}: {exc})", path=path,
                            hint="Restore the lockfile or download again.") from exc


@dataclass
class VerifyResult:
    path: str
    ok: bool
    repo: str
    source: str
    commit: str
    checked: int
    total_bytes: int
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)


def verify_dir(directory: Path) -> VerifyResult:
    """Re-hash every locked file; report missing, changed and extra files. Reads nothing remote."""
    directory = Path(directory)
    if not directory.is_dir():
        raise NotFoundError(f"{directory} is not a directory", hint="Give the directory `qlift download` wrote.")
    lock = read_lock(directory)
    result = VerifyResult(str(directory), True, lock.repo, lock.source, lock.commit, 0, lock.total_bytes)
    locked = {f.path for f in lock.files}
    bar = progress.byte_bar(lock.total_bytes, desc="verify")
    present = {}
    for f in lock.files:
        p = directory / f.path
        if not p.is_file():
            result.missing.append(f.path)
        elif p.stat().st_size != f.size:
            result.changed.append(f.path)
            result.checked += 1
        else:
            present[p] = f
    hashes = FileHashes(present, hash_threads())
    try:
        for p, digest in hashes.each():
            if digest != present[p].sha256:
                result.changed.append(present[p].path)
            result.checked += 1
            bar.update(present[p].size)
    finally:
        hashes.cancel()
        bar.close()
    order = {f.path: i for i, f in enumerate(lock.files)}
    result.changed.sort(key=order.__getitem__)
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory).as_posix()
        if p.is_file() and rel not in locked and rel not in (LOCK_NAME, MANIFEST_NAME):
            result.extra.append(rel)
    result.ok = not (result.missing or result.changed or result.extra)
    return result
