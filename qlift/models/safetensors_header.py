"""Read safetensors headers (names, dtypes, shapes, offsets) without loading tensors."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from qlift.errors import BadInputError

# Bytes per element for every dtype the safetensors format defines.
DTYPE_BYTES: dict[str, float] = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}
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
    """Return (tensors by name, ``__metadata__``) of one safetensors file."""
    try:
        with open(path, "rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) != 8:
                raise ValueError("file shorter than 8 bytes")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > _MAX_HEADER:
                raise ValueError(f"header length {header_len} is implausible")
            header = json.loads(fh.read(header_len))
    except (OSError, ValueError) as exc:
        raise BadInputError(
            f"not a readable safetensors file ({exc})",
            path=path,
            hint="Re-download or re-export the checkpoint.",
        ) from exc
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + header_len
    tensors = {}
    for name, entry in header.items():
        start, end = entry["data_offsets"]
        tensors[name] = TensorInfo(
            name=name,
            dtype=entry["dtype"],
            shape=tuple(entry["shape"]),
            file=path.name,
            nbytes=end - start,
            offset=data_start + start,
        )
    return tensors, metadata
