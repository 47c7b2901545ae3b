"""``ModelRef``: what a model version is. A base model directory, the LoRA adapters applied on
top of it (in order), and one content hash over all of them.

The hash of a plain directory is its lineage content hash (``qlift.lineage.describe_input``:
path, size and sha256 of every file, reusing the digests a ``qlift.json`` records for unchanged
files), the digest `qlift eval` writes as ``candidate.content_hash`` (eval hashes its local
models through the ref it is given) and the eval gate matches, against the
rollout spec's ``canary_hash`` or the canary's dir. `qlift serve` records the ModelRef it serves
(``model.json``), and a router backend entry can carry its hash (``model_hash``).

Identity is computed once and carried: merge, quantize and download return their output's ref
(``ModelRef.written``, from the records of the ``qlift.json`` they wrote), and the stages' inputs take
a ref (the CLI's ``ModelRef.at``, hashed when first read), so a release hashes each model directory at most
once (docs/release.md, "ModelRef").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, computed_field

from qlift import lineage
from qlift.fsutil import write_json_atomic


class AdapterRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(description="Name of the adapter (what a server would call it).")
    path: Path = Field(description="The adapter directory (adapter_config.json + weights).")


class ModelRef(BaseModel):
    """A model version: ``base`` plus ``adapters`` in order, identified by ``content_hash``.

    Built without a hash (``ModelRef.at``, what the CLI passes a stage), the hash is computed when first
    read, remembering file hashes in ``hash_memo()``: a stage that never asks (merge, quantize, `qlift plan`
    without an FP8-KV report) reads no weights for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    base: Path = Field(description="The model directory.")
    adapters: tuple[AdapterRef, ...] = Field((), description="LoRA adapters applied on top, in order.")
    _hash: str | None = PrivateAttr(None)

    def __init__(self, *, base: Path, adapters: Iterable[AdapterRef] = (), content_hash: str | None = None) -> None:
        super().__init__(base=base, adapters=tuple(adapters))
        self._hash = content_hash

    @computed_field(description="sha256 over the base's and the adapters' lineage content hashes.", repr=False)  # type: ignore[prop-decorator]
    @property
    def content_hash(self) -> str:
        if self._hash is None:
            self._hash = ref_hash(self.base, self.adapters, memo=hash_memo())
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ModelRef):
            return NotImplemented
        return (self.base, self.adapters, self.content_hash) == (other.base, other.adapters, other.content_hash)

    def __hash__(self) -> int:
        return hash((self.base, self.adapters))

    @classmethod
    def at(cls, base: Path, adapters: Iterable[AdapterRef] = ()) -> ModelRef:
        """``base`` (and ``adapters``) as a command line names them, hashed only if a stage reads the hash."""
        return cls(base=Path(base), adapters=adapters)

    @classmethod
    def of(cls, base: Path, adapters: Iterable[AdapterRef] = (), *, memo: Path | None = None) -> ModelRef:
        """Hash ``base`` (and ``adapters``) now; cheap for a dir whose qlift.json still matches its files.
        ``memo``: see ``dir_hash``."""
        adapters = tuple(adapters)
        return cls(base=Path(base), adapters=adapters, content_hash=ref_hash(Path(base), adapters, memo=memo))

    @classmethod
    def written(cls, base: Path, outputs: dict[str, lineage.FileRecord]) -> ModelRef:
        """The ref of a directory a stage just wrote, from the file records its ``qlift.json`` holds
        (``lineage.write_manifest``'s ``outputs``): no file is read again."""
        return cls(base=Path(base), content_hash=lineage.content_hash(outputs))

    def with_adapters(self, adapters: Iterable[AdapterRef], *, memo: Path | None = None) -> ModelRef:
        """This plain model with ``adapters`` on top: its hash is reused, only the adapters are hashed."""
        if self.adapters:
            raise ValueError(f"{self.base} already carries adapters; add them to its plain ref")
        adapters = tuple(adapters)
        return ModelRef(base=self.base, adapters=adapters,
                        content_hash=_combined(self.content_hash, adapters, memo))

    @property
    def short(self) -> str:
        return self.content_hash.removeprefix("sha256:")[:12]


def hash_memo() -> Path:
    """Where remembered file hashes live: the eval cache's ``hashes`` folder, where `qlift eval`
    has always kept them, so eval and serve hash a hand-made checkpoint once between them."""
    from qlift.settings import eval_cache_dir

    return eval_cache_dir() / "hashes"


def dir_hash(path: Path, memo: Path | None = None) -> str:
    """The lineage content hash of a file or directory (the eval gate's and every manifest's digest).

    ``memo``: a folder remembering a directory's file hashes by (size, mtime), for a directory
    without a ``qlift.json`` (a hand-made checkpoint), so a 15 GB model is hashed once, not per run.
    The digest is the same with or without it.
    """
    path = Path(path)
    if memo is None or not path.is_dir():
        return lineage.describe_input("model", path)[0].content_hash
    path = path.resolve()
    file = memo / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json")
    known = (lineage.read_manifest(path) or {}).get("outputs")
    if not known:
        try:
            known = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = None
    records = lineage.hash_files(path, known)
    file.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(file, {k: asdict(v) for k, v in records.items()}, indent=None)
    return lineage.content_hash(records)


def ref_hash(base: Path, adapters: tuple[AdapterRef, ...] = (), *, memo: Path | None = None) -> str:
    """A plain directory's lineage hash; with adapters, one digest over base and (name, hash) of each."""
    return _combined(dir_hash(base, memo), adapters, memo)


def _combined(base_hash: str, adapters: tuple[AdapterRef, ...], memo: Path | None) -> str:
    if not adapters:
        return base_hash
    h = hashlib.sha256(base_hash.encode())
    for a in adapters:
        h.update(f"\n{a.name}\0{dir_hash(a.path, memo)}".encode())
    return "sha256:" + h.hexdigest()
