"""Run a merge plan: read each base shard once, front to back, and write the output shards.

Only one tensor is in memory at a time. Tensors no adapter touches are copied as raw
bytes. Every output shard is hashed by a thread that follows its writer, so the lineage
manifest needs no second pass over multi-GB files (run.py's FileHasher hashes the inputs).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from qlift.errors import IncompatibleError
from qlift.merge.maths import apply_step
from qlift.merge.plan import Entry, Plan
from qlift.merge.stio import RawTensor, Scratch, ShardReader, ShardWriter, WriteQueue, read_layout
from qlift.progress import bar

if TYPE_CHECKING:
    import torch

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def torch_dtype(name: str) -> torch.dtype:
    import torch

    table = {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
        "BOOL": torch.bool,
    }
    if name not in table:
        raise IncompatibleError(f"tensors of dtype {name} cannot be merged",
                                hint="Merge into an unquantized (bf16/fp16/fp32) base model.")
    return table[name]


def _nbytes(e: Entry) -> int:
    n = 1
    for d in e.shape:
        n *= d
    return n * DTYPE_BYTES[e.out_dtype] if e.out_dtype in DTYPE_BYTES else -1


@dataclass
class WriteResult:
    files: list[str]
    weight_map: dict[str, str]
    total_size: int
    bytes_read: int = 0
    bytes_written: int = 0
    modified: int = 0
    hashes: dict[str, str] = field(default_factory=dict)  # resolved path -> sha256 of each output


def _layout(plan: Plan, base_dir: Path, files: list[str]) -> list[tuple[str, list[tuple[RawTensor, list[Entry]]]]]:
    by_source = plan.sources()
    return [(f, [(t, by_source.get(t.name, [])) for t in read_layout(base_dir / f)]) for f in files]


def _pack(order: list[Entry], max_bytes: int) -> list[list[Entry]]:
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in order:
        n = _nbytes(e)
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += n
    return shards


def write_shards(
    plan: Plan, *, base_dir: Path, base_files: list[str], out_dir: Path, max_shard_bytes: int, device: str = "cpu"
) -> WriteResult:
    import torch

    dev = torch.device(device)
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)  # the maths is memory-bound; the other core hashes
    layout = _layout(plan, base_dir, base_files)
    order = [e for _, items in layout for _, consumers in items for e in consumers]
    for e in order:
        if _nbytes(e) < 0:
            raise IncompatibleError(f"tensor {e.name} has dtype {e.out_dtype}, which qlift cannot write",
                                    hint="Merge into an unquantized (bf16/fp16/fp32) base model.")
    shards = _pack(order, max_shard_bytes)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    owner = {e.name: i for i, shard in enumerate(shards) for e in shard}
    result = WriteResult(files=names, weight_map={e.name: names[owner[e.name]] for e in order},
                         total_size=sum(_nbytes(e) for e in order))
    writes = WriteQueue()
    out_scratch = Scratch(writes)
    readers: list[ShardReader] = []
    writers: list[ShardWriter] = []

    def writer_for(e: Entry) -> ShardWriter:
        i = owner[e.name]
        while len(writers) <= i:
            if writers:
                writes.put(writers[-1].close)
            shard = shards[len(writers)]
            meta = [(x.name, x.out_dtype, x.shape, _nbytes(x)) for x in shard]
            writers.append(ShardWriter(out_dir / names[len(writers)], meta))
        return writers[i]

    try:
        total = sum(len(items) for _, items in layout)
        flat = ((f, t, c) for f, items in layout for t, c in items)
        current: str | None = None
        for f, t, consumers in bar(flat, total=total, desc="merge", unit="tensor"):
            if f != current:
                if readers:
                    readers[-1].finish()
                readers.append(ShardReader(base_dir / f))
                current = f
            reader = readers[-1]
            if len(consumers) == 1 and not consumers[0].steps and consumers[0].out_dtype == t.dtype:
                w = writer_for(consumers[0])
                for chunk in reader.chunks(t):
                    writes.put(w.write, chunk)  # the mapped chunk stays mapped while queued
                continue
            if not consumers:
                continue
            raw = reader.read(t)
            src = _as_tensor(raw, t)
            for e in consumers:
                view = out_scratch.take(_nbytes(e))
                out = _as_tensor(view, RawTensor(e.name, e.out_dtype, e.shape, 0, len(view)))
                _compute(src, e, dev, out)
                out_scratch.release(writes.put(writer_for(e).write, view))
                result.modified += bool(e.steps)
        writes.close()
        if readers:
            readers[-1].finish()
    except BaseException:
        with contextlib.suppress(BaseException):
            writes.close()
        for w in writers:
            w.close()
            w.hasher.cancel()
        raise
    finally:
        torch.set_num_threads(threads)
    for w in writers:
        w.close()
        result.bytes_written += w.bytes_written
        result.hashes[str(w.path.resolve())] = w.hasher.result()
    result.bytes_read = sum(r.bytes_read for r in readers)
    return result


def _as_tensor(raw: memoryview, t: RawTensor) -> torch.Tensor:
    import torch

    dtype = torch_dtype(t.dtype)
    if not len(raw):
        return torch.empty(t.shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=dtype).reshape(t.shape)


def _compute(src: torch.Tensor, e: Entry, dev: torch.device, out: torch.Tensor) -> None:
    """Apply ``e``'s steps to ``src`` and leave the result in ``out`` (CPU, output dtype)."""
    w = src.to(device=dev, dtype=torch_dtype(e.out_dtype))
    for i, step in enumerate(e.steps):
        last = i == len(e.steps) - 1
        w = apply_step(w, step, dev, out=out if last and dev.type == "cpu" else None)
    if w is not out:
        out.copy_(w)
