"""The lineage manifest ``qlift.json`` that every stage writes into its output.

It records what was done (operation, parameters, qlift version, times), to what
(inputs with a content hash), what came out (every file's size and sha256) and the
manifests of the inputs themselves, so a served model can be traced back to the hub
commit it started from.
"""

from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from qlift import __version__
from qlift.fsutil import contained, sha256_file, sha256_files, write_json_atomic
from qlift.loaders import read_json_object, validated

MANIFEST_NAME = "qlift.json"
SCHEMA_VERSION = 1


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class FileRecord:
    size: int
    sha256: str
    mtime_ns: int = 0


@dataclass
class InputRef:
    role: str
    path: str
    content_hash: str


@dataclass
class Manifest:
    operation: str
    parameters: dict[str, Any]
    inputs: list[InputRef]
    outputs: dict[str, FileRecord]
    parents: dict[str, dict[str, Any]] = field(default_factory=dict)
    started_at: str = field(default_factory=utc_now)
    finished_at: str = field(default_factory=utc_now)
    qlift_version: str = __version__
    python: str = field(default_factory=platform.python_version)
    schema: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _RecordedFile(BaseModel):
    model_config = ConfigDict(extra="allow")
    size: int | None = Field(None, strict=True, ge=0)
    sha256: str | None = Field(None, strict=True)
    mtime_ns: int | None = Field(None, strict=True)


class _ManifestShape(BaseModel):
    """What qlift reads back from a manifest; a manifest of another shape is refused, not half-trusted."""

    model_config = ConfigDict(extra="allow")
    operation: str | None = Field(None, strict=True)
    outputs: dict[str, _RecordedFile] | None = None
    parents: dict[str, dict[str, Any]] | None = None


def read_manifest(model_dir: Path) -> dict[str, Any] | None:
    """``model_dir``'s manifest, or None when it has none; a malformed one is BadInputError."""
    p = Path(model_dir) / MANIFEST_NAME
    if not p.is_file():
        return None
    hint = f"Delete or restore {p} (qlift's lineage record; it is rewritten by the next stage)."
    data = read_json_object(p, hint=hint)
    validated(_ManifestShape, data, path=p, hint=hint)
    return data


def hash_files(
    root: Path, known: dict[str, dict[str, Any]] | None = None, precomputed: dict[str, str] | None = None
) -> dict[str, FileRecord]:
    """sha256 of every file under ``root`` except the manifest.

    ``known`` (records from an earlier manifest) is reused for files whose size and
    mtime still match, so hashing an unchanged multi-GB input costs nothing.
    ``precomputed`` maps resolved file paths to sha256 hex digests the caller already
    computed while streaming the bytes (e.g. merge), so they are not read again.
    """
    known = known or {}
    precomputed = precomputed or {}
    records: dict[str, FileRecord] = {}
    todo: dict[str, tuple[Path, os.stat_result]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or rel == MANIFEST_NAME:
            continue
        st = p.stat()
        prev = known.get(rel)
        pre = precomputed.get(str(p.resolve()))
        if pre:
            records[rel] = FileRecord(st.st_size, pre, st.st_mtime_ns)
        elif _still_valid(prev, st):
            assert prev is not None
            records[rel] = FileRecord(st.st_size, prev["sha256"], st.st_mtime_ns)
        else:
            todo[rel] = (p, st)
            records[rel] = FileRecord(st.st_size, "", st.st_mtime_ns)  # its place in the order
    digests = sha256_files(p for p, _ in todo.values())
    for rel, (p, st) in todo.items():
        records[rel] = FileRecord(st.st_size, digests[str(p.resolve())], st.st_mtime_ns)
    return records


def unhashed_files(root: Path) -> list[Path]:
    """The files ``describe_input`` of the directory ``root`` would read: all but the manifest and those its
    manifest records unchanged. Hash them early (``fsutil.FileHashes``) and pass the digests as ``precomputed``."""
    root = Path(root)
    known = recorded_hashes(root)
    return [p for p in sorted(root.rglob("*"))
            if p.is_file() and (rel := p.relative_to(root).as_posix()) != MANIFEST_NAME and rel not in known]


def still_written(path: Path, size: int, mtime_ns: int) -> bool:
    """Whether ``path`` is still the file a digest was taken of (same size and mtime)."""
    try:
        st = Path(path).stat()
    except OSError:
        return False
    return st.st_size == size and st.st_mtime_ns == mtime_ns


def _still_valid(prev: dict[str, Any] | None, st: os.stat_result) -> bool:
    return bool(prev and prev.get("sha256") and prev.get("size") == st.st_size
                and prev.get("mtime_ns") == st.st_mtime_ns)


def recorded_hashes(root: Path) -> dict[str, str]:
    """sha256 digests that ``root``'s own manifest records for files still unchanged (same
    size and mtime): what ``describe_input`` will reuse instead of reading the file again."""
    manifest = read_manifest(root)
    known = (manifest or {}).get("outputs") or {}
    out: dict[str, str] = {}
    for rel, prev in known.items():
        try:
            st = contained(Path(root), rel, source=Path(root) / MANIFEST_NAME).stat()
        except OSError:
            continue
        if isinstance(prev, dict) and _still_valid(prev, st):
            out[rel] = str(prev["sha256"])
    return out


def content_hash(records: dict[str, FileRecord]) -> str:
    """One digest over (path, size, sha256) of every file: the identity of a directory."""
    h = hashlib.sha256()
    for rel in sorted(records):
        r = records[rel]
        h.update(f"{rel}\0{r.size}\0{r.sha256}\n".encode())
    return "sha256:" + h.hexdigest()


def describe_input(
    role: str, path: Path, precomputed: dict[str, str] | None = None
) -> tuple[InputRef, dict[str, Any] | None]:
    """Content-hash an input file or directory and return its manifest, if it has one."""
    path = Path(path)
    if path.is_file():
        rec = FileRecord(path.stat().st_size, sha256_file(path))
        return InputRef(role, str(path.resolve()), "sha256:" + rec.sha256), None
    parent = read_manifest(path)
    known = parent.get("outputs") if parent else None
    records = hash_files(path, known, precomputed)
    return InputRef(role, str(path.resolve()), content_hash(records)), parent


def write_manifest(
    out_dir: Path,
    *,
    operation: str,
    inputs: dict[str, Path],
    parameters: dict[str, Any],
    started_at: str,
    precomputed: dict[str, str] | None = None,
) -> Manifest:
    """Hash ``out_dir`` and its inputs and write ``out_dir/qlift.json``.

    Call it last, once every other output file is in place. ``precomputed``: see hash_files.
    """
    refs: list[InputRef] = []
    parents: dict[str, dict[str, Any]] = {}
    for role, path in inputs.items():
        ref, parent = describe_input(role, path, precomputed)
        refs.append(ref)
        if parent is not None:
            parents[role] = parent
    manifest = Manifest(
        operation=operation,
        parameters=parameters,
        inputs=refs,
        outputs=hash_files(Path(out_dir), precomputed=precomputed),
        parents=parents,
        started_at=started_at,
    )
    write_json_atomic(Path(out_dir) / MANIFEST_NAME, manifest.to_dict())
    return manifest


def lineage_chain(manifest: dict[str, Any] | None) -> list[str]:
    """Operations from the oldest ancestor to ``manifest``, following the first parent."""
    chain: list[str] = []
    node: Any = manifest
    while isinstance(node, dict) and node:
        chain.append(str(node.get("operation", "?")))
        parents = node.get("parents")
        node = next(iter(parents.values()), None) if isinstance(parents, dict) else None
    return list(reversed(chain))
