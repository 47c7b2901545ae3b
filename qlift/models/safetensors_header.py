"""Read safetensors headers (names, dtypes, shapes, offsets) without loading tensors."""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from qlift.errors import BadInputError
from qlift.models.dtypes import ELEMENT_BYTES as DTYPE_BYTES

_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    nbytes: int
    offset: int = 0  # where the tensor's bytes start in the file (absolute)

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Return (tensors by name, ``__metadata__``) of one safetensors file.

    The header is checked as the safetensors library checks it before reading any tensor
    (each entry's dtype, integer shape and offsets; byte counts matching shape x dtype;
    tensors tiling the data section with no gap or overlap), and the file must hold
    every byte the header declares: a truncated shard is refused, not half-counted.
    """
    hint = "Re-download or re-export the checkpoint."
    try:
        with open(path, "rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) != 8:
                raise ValueError("file shorter than 8 bytes")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > _MAX_HEADER:
                raise ValueError(f"header length {header_len} is implausible")
            raw = fh.read(header_len)
            size = os.fstat(fh.fileno()).st_size
        if len(raw) != header_len:
            raise ValueError(f"file ends inside the {header_len}-byte header")
        header = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise BadInputError("not a readable safetensors file (header nested too deeply)", path=path,
                            hint=hint) from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise BadInputError(f"not a readable safetensors file ({exc})", path=path, hint=hint) from exc
    if not isinstance(header, dict):
        raise BadInputError("not a readable safetensors file (the header is not a JSON object)", path=path,
                            hint=hint)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadInputError("must map names to strings", path=path, field="__metadata__", hint=hint)
    data_start = 8 + header_len
    tensors = {name: _entry(path, name, entry, data_start) for name, entry in header.items()}
    _check_tiling(path, tensors, data_start, size, hint)
    return tensors, metadata


def _entry(path: Path, name: str, entry: object, data_start: int) -> TensorInfo:
    def bad(why: str) -> BadInputError:
        return BadInputError(why, path=path, field=name, hint="Re-download or re-export the checkpoint.")

    if not isinstance(entry, dict):
        raise bad("a tensor entry must be an object with dtype, shape and data_offsets")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise bad(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise bad(f"shape must be a list of non-negative integers, got {shape!r:.60}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)
            and offsets[0] <= offsets[1]):
        raise bad(f"data_offsets must be [start, end] with 0 <= start <= end, got {offsets!r:.60}")
    info = TensorInfo(name=name, dtype=dtype, shape=tuple(shape), file=path.name, nbytes=offsets[1] - offsets[0],
                      offset=data_start + offsets[0])
    expected = info.numel * DTYPE_BYTES[dtype]
    if expected != info.nbytes:
        raise bad(f"shape {list(shape)} x {dtype} is {expected:g} bytes but data_offsets span {info.nbytes}")
    return info


def _check_tiling(path: Path, tensors: dict[str, TensorInfo], data_start: int, file_size: int, hint: str) -> None:
    pos = 0  # relative to the data section
    for t in sorted(tensors.values(), key=lambda t: (t.offset, t.nbytes)):
        begin = t.offset - data_start
        if begin != pos:
            what = "overlaps the tensor before it" if begin < pos else f"leaves {begin - pos} bytes unused before it"
            raise BadInputError(f"data_offsets: the tensor {what}", path=path, field=t.name, hint=hint)
        pos = begin + t.nbytes
    held = file_size - data_start
    if held < pos:
        raise BadInputError(
            f"truncated: the header declares {pos:,} bytes of tensor data, the file holds {max(held, 0):,}",
            path=path, hint=hint)
    if held > pos:
        raise BadInputError(f"{held - pos:,} bytes follow the last tensor the header declares", path=path, hint=hint)
