"""Streaming safetensors I/O: read shards in file order and write shards tensor by tensor.

safetensors' ``save_file`` needs every tensor of a shard in memory at once; writing
the header first (every shape is known from the plan) lets the merge hold one tensor
at a time, copy untouched tensors as raw bytes, and hash the output bytes on another
thread while they pass through. Input files are hashed by a thread of their own
(``FileHasher``), started before torch is imported, so hashing them overlaps that too.
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError

CHUNK = 16 * 1024 * 1024
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
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
    except (OSError, ValueError, struct.error) as exc:
        raise BadInputError(f"not a readable safetensors file ({exc})", path=path,
                            hint="Re-download or re-export the checkpoint.") from exc
    header.pop("__metadata__", None)
    base = 8 + n
    out = [
        RawTensor(name, e["dtype"], tuple(e["shape"]), base + e["data_offsets"][0], base + e["data_offsets"][1])
        for name, e in header.items()
    ]
    return sorted(out, key=lambda t: t.start)


class Hasher:
    """sha256 of several byte streams, computed on a background thread.

    hashlib releases the GIL on large buffers, so hashing overlaps the main thread's
    reads, writes and tensor maths. Callers must not mutate a buffer after ``feed``.
    """

    def __init__(self, depth: int = 8) -> None:
        self._q: queue.Queue[tuple[Any, Any] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._done = 0
        self.fed = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="qlift-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            h, data = item
            try:
                h.update(data)
            except BaseException as exc:  # surfaced by close()
                self._error = exc
            with self._cond:
                self._done += 1
                self._cond.notify_all()

    def feed(self, h: Any, data: Any) -> None:
        self.fed += 1
        self._q.put((h, data))

    def wait(self, seq: int) -> None:
        """Block until the first ``seq`` buffers fed are hashed (so they may be reused)."""
        with self._cond:
            while self._done < seq and self._thread.is_alive():
                self._cond.wait(0.5)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


class FileHasher:
    """sha256 of whole files, read and hashed on a background thread.

    Runs independently of the merge stream (both read the same page-cached bytes), so
    it can start before torch is imported and runs on its own core.
    """

    def __init__(self, paths: list[Path]) -> None:
        self._paths = list(paths)
        self._digests: dict[str, str] = {}
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qlift-hash-in", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for path in self._paths:
                h = hashlib.sha256()
                with open(path, "rb", buffering=0) as fh:
                    size = os.fstat(fh.fileno()).st_size
                    for pos in range(0, size, 4 * CHUNK):
                        if self._stop.is_set():
                            return
                        h.update(map_range(fh.fileno(), pos, min(pos + 4 * CHUNK, size)))
                self._digests[str(path.resolve())] = h.hexdigest()
        except BaseException as exc:  # surfaced by result()
            self._error = exc

    def result(self) -> dict[str, str]:
        """Resolved path -> sha256 hex digest of every file given."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return dict(self._digests)

    def cancel(self) -> None:
        self._stop.set()
        self._thread.join()


class Scratch:
    """One reusable buffer for whole tensors, handed out again only once the hasher is done with it."""

    def __init__(self, hasher: Hasher) -> None:
        self._hasher = hasher
        self._buf = bytearray(0)
        self._seq = 0

    def take(self, n: int) -> memoryview:
        self._hasher.wait(self._seq)
        if len(self._buf) < n:
            self._buf = bytearray(n)
        return memoryview(self._buf)[:n]

    def release(self) -> None:
        """Mark the buffer as fed to the hasher up to now."""
        self._seq = self._hasher.fed


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
    """Maps one safetensors file's tensors, in file order (``FileHasher`` hashes the inputs).

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
    """Writes one safetensors file whose header is known up front, hashing as it goes."""

    def __init__(self, path: Path, entries: list[tuple[str, str, tuple[int, ...], int]], hasher: Hasher) -> None:
        self.path = path
        self.sha = hashlib.sha256()
        self._hasher = hasher
        # Unbuffered: writes are whole tensors or 16 MiB chunks, which a buffer would only copy.
        self._fh: io.FileIO = open(path, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self.bytes_written = 0
        self.write(header_bytes(entries))

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        fd, done = self._fh.fileno(), 0
        while done < len(view):  # a write may also be partial
            done += os.write(fd, view[done:done + WRITE_PIECE])
        self.bytes_written += done
        self._hasher.feed(self.sha, view)

    def close(self) -> None:
        """Close the file (again is fine); ``sha`` is final after Hasher.close()."""
        self._fh.close()
