"""Run a merge plan: one pipeline per output shard, several at once where there are cores.

A pipeline holds one tensor at a time (plus the one being written): tensors no adapter
touches are copied as raw bytes, the others are computed into a reused buffer. Its
writes run on a thread behind the maths and its sha256 on a thread behind the writes,
so the lineage manifest needs no second pass over multi-GB files (fsutil.FileHashes
hashes the inputs).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlift.errors import IncompatibleError
from qlift.merge.maths import apply_step
from qlift.merge.plan import Entry, Plan
from qlift.merge.stio import RawTensor, Scratch, ShardReader, ShardWriter, WriteQueue, read_layout
from qlift.models import dtypes
from qlift.models.dtypes import ELEMENT_BYTES, TORCH_NAMES
from qlift.progress import tracker

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DTYPE_BYTES = {code: int(ELEMENT_BYTES[code]) for code in TORCH_NAMES}  # the dtypes a merge can write


def torch_dtype(name: str) -> torch.dtype:
    dtype = dtypes.torch_dtype(name)
    if dtype is None:
        raise IncompatibleError(f"tensors of dtype {name} cannot be merged",
                                hint="Merge into an unquantized (bf16/fp16/fp32) base model.")
    return dtype


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


def _pack(order: list[Entry], max_bytes: int) -> list[list[Entry]]:
    if not order:
        return []
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


def pipelines(shards: int, cores: int) -> int:
    """Output shards written at once: one per three cores (its maths, its writes, its hash),
    and at least two, since one pipeline leaves a core idle while it waits on a write or a
    hash (2 cores, 1.5B: 4.1-4.5 s against 4.5-4.7 s with one)."""
    return max(1, min(shards, max(2, cores // 3)))


@dataclass
class _ShardJob:
    path: Path
    entries: list[Entry]
    source: Path  # the base shard every entry's bytes come from
    tensors: dict[str, RawTensor]  # where each base tensor sits in its file
    device: torch.device
    stop: threading.Event
    progress: Any


@dataclass
class _ShardDone:
    bytes_read: int
    bytes_written: int
    modified: int
    sha256: str


def write_shards(
    plan: Plan, *, base_dir: Path, base_files: list[str], out_dir: Path, max_shard_bytes: int, device: str = "cpu",
    cores: int = 1,
) -> WriteResult:
    import torch

    dev = torch.device(device)
    layouts = {f: read_layout(base_dir / f) for f in base_files}  # each in file order
    tensors = {t.name: t for layout in layouts.values() for t in layout}
    by_source = plan.sources()
    by_file = {f: [e for t in layout for e in by_source.get(t.name, [])] for f, layout in layouts.items()}
    order = [e for f in base_files for e in by_file[f]]
    for e in order:
        if _nbytes(e) < 0:
            raise IncompatibleError(f"tensor {e.name} has dtype {e.out_dtype}, which qlift cannot write",
                                    hint="Merge into an unquantized (bf16/fp16/fp32) base model.")
    # The output keeps the base's sharding (split further at max_shard_bytes): deterministic
    # on any machine, and one pipeline per base shard, each reading one file front to back.
    shards = [(f, s) for f in base_files for s in _pack(by_file[f], max_shard_bytes)]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    named = list(zip(names, shards, strict=True))
    result = WriteResult(files=names, weight_map={e.name: n for n, (_, shard) in named for e in shard},
                         total_size=sum(_nbytes(e) for e in order))
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)  # the maths is memory-bound; other cores write and hash
    stop = threading.Event()
    tick = tracker(len(order), desc="merge: writing shards", unit="tensors")
    jobs = [_ShardJob(out_dir / n, shard, base_dir / f, tensors, dev, stop, tick) for n, (f, shard) in named]
    pool = ThreadPoolExecutor(pipelines(len(jobs), cores), thread_name_prefix="qlift-shard")
    futures = [pool.submit(_write_shard, job) for job in jobs]
    try:
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = [x for f in futures if f.done() and (x := f.exception()) is not None]
        if failed:
            raise next((x for x in failed if not isinstance(x, _Stopped)), failed[0])
        done = [f.result() for f in futures]
    except BaseException:  # a pipeline failed, or Ctrl-C: the others give up at their next tensor
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        tick.close()
        torch.set_num_threads(threads)
    for job, d in zip(jobs, done, strict=True):
        result.bytes_read += d.bytes_read
        result.bytes_written += d.bytes_written
        result.modified += d.modified
        result.hashes[str(job.path.resolve())] = d.sha256
    return result


def _write_shard(job: _ShardJob) -> _ShardDone:
    """One output shard, tensor by tensor: maths here, writes on a thread behind it, the
    sha256 on a thread behind that."""
    t0 = time.perf_counter()
    writes = WriteQueue()
    scratch = Scratch(writes)
    reader = ShardReader(job.source)
    w = ShardWriter(job.path, [(e.name, e.out_dtype, e.shape, _nbytes(e)) for e in job.entries])
    modified, maths_s, waited_s = 0, 0.0, 0.0
    try:
        for e in job.entries:
            if job.stop.is_set():
                raise _Stopped
            t = job.tensors[e.source]
            if not e.steps and e.out_dtype == t.dtype:
                for chunk in reader.chunks(t):
                    writes.put(w.write, chunk)  # the mapped chunk stays mapped while queued
            else:
                t1 = time.perf_counter()
                view = scratch.take(_nbytes(e))
                t2 = time.perf_counter()
                out = _as_tensor(view, RawTensor(e.name, e.out_dtype, e.shape, 0, len(view)))
                _compute(_as_tensor(reader.read(t), t), e, job.device, out)
                scratch.release(writes.put(w.write, view))
                waited_s += t2 - t1
                maths_s += time.perf_counter() - t2
                modified += bool(e.steps)
            job.progress.update(1)
        writes.close()
    except BaseException:
        with contextlib.suppress(BaseException):
            writes.close()
        w.close()
        w.hasher.cancel()
        raise
    finally:
        reader.finish()
    w.close()
    t_written = time.perf_counter()
    digest = w.hasher.result()
    log.debug("%s: %.2f GB in %.2f s (maths %.2f s, waiting on writes %.2f s, writes %.2f s, sha256 %.2f s, "
              "%.2f s of it after the last write)", job.path.name, w.bytes_written / 1e9, time.perf_counter() - t0,
              maths_s, waited_s, w.busy_s, w.hasher.busy_s, time.perf_counter() - t_written)
    return _ShardDone(bytes_read=reader.bytes_read, bytes_written=w.bytes_written,
                      modified=modified, sha256=digest)


class _Stopped(Exception):
    """Another pipeline failed; its error is the one raised."""


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
