"""Which Linear layers get quantized, and the largest group size that fits them all.

Pure Python: used by qlift before starting any work (from safetensors headers) and by the
worker again on the loaded model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from qlift.errors import IncompatibleError

GROUP_SIZES = (128, 64, 32)
ALWAYS_IGNORED = ("lm_head",)


def matches(name: str, patterns: Iterable[str]) -> bool:
    """llm-compressor's ignore semantics: exact module name, or ``re:REGEX`` (re.match)."""
    for pat in patterns:
        if pat.startswith("re:"):
            if re.match(pat[3:], name):
                return True
        elif name == pat:
            return True
    return False


def choose_group_size(in_features: Mapping[str, int], requested: int | None) -> int:
    """``requested`` if every layer's input dim is a multiple of it, else the largest that is.

    ``requested=None`` means auto: the largest of 128/64/32 that divides every layer.
    """
    if not in_features:
        raise IncompatibleError(
            "the model has no Linear layers left to quantize",
            hint="Check the --ignore patterns.",
        )
    candidates = (requested,) if requested else GROUP_SIZES
    for size in candidates:
        if all(dim % size == 0 for dim in in_features.values()):
            return size
    size = candidates[-1]
    layer, dim = next((n, d) for n, d in sorted(in_features.items()) if d % size)
    fits = [g for g in GROUP_SIZES if all(d % g == 0 for d in in_features.values())]
    hint = (
        f"Use --group-size {fits[0]} (or auto)."
        if fits
        else f"Add --ignore {layer} to leave it unquantized, or use --fp8."
    )
    raise IncompatibleError(
        f"layer {layer} has input dimension {dim}, which is not a multiple of "
        f"{'group size ' + str(size) if requested else 'any group size in 128/64/32'}",
        hint=hint,
    )
