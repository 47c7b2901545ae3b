"""Tensor dtypes in one place: safetensors' codes ("BF16"), torch's names ("bfloat16"), sizes.

Checkpoint headers speak in codes, configs and vLLM in names; each table here is the only
copy, and the others are derived from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Bytes per element for every dtype the safetensors format defines.
ELEMENT_BYTES: dict[str, float] = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}

# The codes qlift computes on with torch (merge reads and writes these), by torch's name.
TORCH_NAMES: dict[str, str] = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}
_FLOATS = ("F32", "F16", "BF16", "F64")
FLOAT_CODES = frozenset(_FLOATS)  # weights a merge or a dtype change may cast
CODE_OF_NAME: dict[str, str] = {TORCH_NAMES[c]: c for c in _FLOATS}  # "bfloat16" -> "BF16"
# Model dtypes vLLM serves in (config.json's dtype / torch_dtype), with their element size.
SERVING_BYTES: dict[str, int] = {n: int(ELEMENT_BYTES[c]) for n, c in CODE_OF_NAME.items() if n != "float64"}


def torch_dtype(code: str) -> torch.dtype | None:
    """torch's dtype for a safetensors code; None for codes torch arithmetic here does not cover."""
    import torch

    name = TORCH_NAMES.get(code)
    return getattr(torch, name) if name else None
