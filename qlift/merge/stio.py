"""Streaming safetensors I/O: read shards in file order and write shards tensor by tensor.

safetensors' ``save_file`` needs every tensor of a shard in memory at once; writing
the header first (every shape is known from the plan) lets the merge hold one tensor
at a time and copy untouched tensors as raw bytes. Hashing runs on threads of its own:
``fsutil.FileHashes`` for the inputs (started before torch is imported, so it overlaps that
too) and a ``TailHasher`` per output shard, following the writer through the page cache.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError
from qlift.models.safetensors_header import read_header

CHUNK = 16 * 1024 * 1024
WINDOW = 64 * 1024 * 1024  # bytes the hashers map at a time
# One write() of more than about 1 MiB cost ~10x the kernel time per byte of 512 KiB
# pieces (ext4, Linux 6.x: 3.0 s against 0.27 s of CPU for 1 GB), so large buffers go
# out in pieces of this size.
WRITE_PIECE = 512 * 1024
ALIGN = 8  # safetensors pads the header so the data section starts 8-byte aligned


@dataclass(frozen=True)
class RawTensor:
    """Where one tensor's bytes sit inside a safetensors file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute file offsets
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_layout(path: Path) -> list[RawTensor]:
    """Tensors of one safetensors file in the order their bytes appear."""
    tensors, _ = read_header(path)
    out = [RawTensor(t.name, t.dtype, t.shape, t.offset, t.offset + t.nbytes) for t in tensors.values()]
    return sorted(out, key=lambda t: t.start)


def _hash_fd(fd: int, start: int, end: int, h: Any, stop: threading.Event) -> str | None:
    for pos in range(start, end, WINDOW):
        if stop.is_set():
            return None
        h.update(map_range(fd, pos, min(pos + WINDOW, end)))
    return str(h.hexdigest())


class TailHasher:
    """sha256 of a file while it is being written, on a thread that follows the writer
    through the page cache.

    The writer never waits for the hash (no buffer is shared), and each output shard
    gets its own thread, so shards are hashed in parallel where there are cores for it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written = 0
        self._closed = False
        self._cancelled = threading.Event()
        self._cond = threading.Condition()
        self._digest: str | None = None
        self._error: BaseException | None = None
        self.busy_s = 0.0
        self._fd = os.open(path, os.O_RDONLY)
        self._thread = threading.Thread(target=self._run, name="qlift-hash-out", daemon=True)
        self._thread.start()

    def advance(self, written: int) -> None:
        """The first ``written`` bytes of the file are in place."""
        with self._cond:
            self._written = written
            self._cond.notify()

    def _run(self) -> None:
        h, pos = hashlib.sha256(), 0
        try:
            while True:
                with self._cond:
                    while self._written - pos < WINDOW and not self._closed and not self._cancelled.is_set():
                        self._cond.wait()
                    end, closed = self._written, self._closed
                if self._cancelled.is_set():
                    return
                t0 = time.perf_counter()
                _hash_fd(self._fd, pos, end, h, self._cancelled)
                self.busy_s += time.perf_counter() - t0
                pos = end
                if closed:
                    self._digest = h.hexdigest()
                    return
        except BaseException as exc:  # surfaced by result()
            self._error = exc
        finally:
            os.close(self._fd)

    def close(self) -> None:
        """No more bytes will come."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def cancel(self) -> None:
        self._cancelled.set()
        self.close()
        self._thread.join()

    def result(self) -> str:
        self.close()
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._digest is not None
        return self._digest


class WriteQueue:
    """Runs writes on a thread of its own (os.write releases the GIL), so the maths of the
    next tensor overlaps the write of the last one. Each ``put`` returns a sequence number;
    ``wait(seq)`` blocks until that call and all before it have run."""

    def __init__(self, depth: int = 8) -> None:
        self._q: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.Queue(maxsize=depth)
        self._cond = threading.Condition()
        self._done = 0
        self.submitted = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="qlift-write", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            fn, args = item
            if self._error is None:
                try:
                    fn(*args)
                except BaseException as exc:  # surfaced by put/wait/close
                    self._error = exc
            with self._cond:
                self._done += 1
                self._cond.notify_all()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, fn: Callable[..., Any], *args: Any) -> int:
        self._raise()
        self._q.put((fn, args))
        self.submitted += 1
        return self.submitted

    def wait(self, seq: int) -> None:
        with self._cond:
            while self._done < seq:
                self._cond.wait()
        self._raise()

    def close(self) -> None:
        """Run what is queued, stop the thread, raise the first error a write hit."""
        self._q.put(None)
        self._thread.join()
        self._raise()


class Scratch:
    """Two reusable buffers for whole output tensors, so one can be written while the next
    is computed (fresh buffers would cost a page fault per 4 KiB). A buffer is handed out
    again only once the writes queued from it have run; tensors over ``single`` bytes use
    one buffer alone, to keep the resident set near one tensor."""

    def __init__(self, writes: WriteQueue, single: int = 256 * 1024 * 1024) -> None:
        self._writes = writes
        self._single = single
        self._bufs = [bytearray(0), bytearray(0)]
        self._seqs = [0, 0]
        self._next = 0

    def take(self, n: int) -> memoryview:
        i = self._next
        self._writes.wait(self._seqs[i])
        if n > self._single:
            self._writes.wait(max(self._seqs))
            self._bufs[1 - i] = bytearray(0)
        if len(self._bufs[i]) < n:
            self._bufs[i] = bytearray(n)
        return memoryview(self._bufs[i])[:n]

    def release(self, seq: int) -> None:
        """The buffer last taken is in use until write ``seq`` has run."""
        self._seqs[self._next] = seq
        self._next = 1 - self._next


def map_range(fd: int, start: int, end: int, *, writable: bool = False) -> memoryview:
    """Bytes ``start:end`` of an open file, mapped (no copy); unmapped when the last view
    of them is dropped. ``writable`` maps them copy-on-write, so torch may wrap them as a
    tensor; read-only maps are faulted in with one call (MAP_POPULATE on a writable
    private map would copy every page)."""
    if end <= start:
        return memoryview(bytearray(0))
    off = start - start % mmap.ALLOCATIONGRANULARITY
    if writable:
        mm = mmap.mmap(fd, end - off, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=off)
    else:
        mm = mmap.mmap(fd, end - off, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ, offset=off)
    return memoryview(mm)[start - off:]


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault the pages in with one call, not one per 64 KiB


class ShardReader:
    """Maps one safetensors file's tensors, in file order (``fsutil.FileHashes`` hashes the inputs).

    Mapping instead of reading saves a copy of every input byte; mapping only a tensor
    (or a chunk of one) at a time keeps the resident set to about one tensor.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: io.BufferedReader = open(path, "rb")  # noqa: SIM115 - closed in finish()
        self._size = os.fstat(self._fh.fileno()).st_size
        self.bytes_read = 0

    def _map(self, start: int, end: int, writable: bool = False) -> memoryview:
        if end > self._size:
            raise BadInputError(f"file ends early (wanted bytes up to offset {end}, it has {self._size})",
                                path=self.path, hint="Re-download the checkpoint.")
        self.bytes_read += end - start
        return map_range(self._fh.fileno(), start, end, writable=writable)

    def chunks(self, t: RawTensor) -> Iterator[memoryview]:
        """The tensor's bytes in chunks of at most CHUNK bytes, each mapped on its own."""
        for pos in range(t.start, t.end, CHUNK):
            yield self._map(pos, min(pos + CHUNK, t.end))

    def read(self, t: RawTensor) -> memoryview:
        """The whole tensor's bytes (writable copy-on-write, for torch.frombuffer)."""
        return self._map(t.start, t.end, writable=True)

    def finish(self) -> None:
        self._fh.close()


def header_bytes(entries: list[tuple[str, str, tuple[int, ...], int]]) -> bytes:
    """A safetensors header for (name, dtype, shape, nbytes) laid out in that order."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % ALIGN)
    return struct.pack("<Q", len(raw)) + raw


class ShardWriter:
    """Writes one safetensors file whose header is known up front; a TailHasher hashes it."""

    def __init__(self, path: Path, entries: list[tuple[str, str, tuple[int, ...], int]]) -> None:
        self.path = path
        # Unbuffered: writes are whole tensors or 16 MiB chunks, which a buffer would only copy.
        self._fh: io.FileIO = open(path, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self.bytes_written = 0
        self.busy_s = 0.0  # time inside write(), for the stage timings in the debug log
        self.hasher = TailHasher(path)
        self.write(header_bytes(entries))

    def write(self, data: Any) -> None:
        t0 = time.perf_counter()
        view = memoryview(data).cast("B")
        fd, done = self._fh.fileno(), 0
        while done < len(view):  # a write may also be partial
            done += os.write(fd, view[done:done + WRITE_PIECE])
        self.bytes_written += done
        self.busy_s += time.perf_counter() - t0
        self.hasher.advance(self.bytes_written)

    def close(self) -> None:
        """Close the file (again is fine); ``hasher.result()`` gives its sha256."""
        self._fh.close()
        self.hasher.close()
