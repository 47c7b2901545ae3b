"""What a merge can be asked to do besides BASE, ADAPTERS and the output: the one definition
``merge_model`` takes and ``qlift merge``'s options are generated from; its values (device, shard size,
limits) are checked on construction, for the CLI and a release's merge stage alike."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated

from qlift.errors import BadInputError
from qlift.options import Range, check_fields

DEFAULT_TOLERANCE = 0.02


@dataclass(frozen=True)
class MergeOptions:
    dtype: str = field(default="auto", metadata={"choices": ("auto", "bf16", "fp16", "fp32")})
    """Dtype of the merged weights (auto: keep the base's)."""
    max_shard_size: str = "5GB"
    """Largest output shard, e.g. 5GB, 2GiB (the base's sharding is kept, split further at this size)."""
    device: str = "cpu"
    """Where deltas are computed: cpu or cuda."""
    verify: bool | None = field(default=None, metadata={"flag_pair": True})
    """Compare logits with peft on a few chat prompts [default: on under 2B parameters]."""
    tolerance: Annotated[float, Range(ge=0)] = DEFAULT_TOLERANCE
    """--verify fails above this max |logit delta| relative to the largest logit."""
    strict: bool = False
    """Fail (not warn) when an adapter names a different base model."""
    force: bool = False
    """Replace an existing output directory."""
    allow_pickle: bool = False
    """Accept adapter_model.bin (pickle) from a trusted source."""

    def __post_init__(self) -> None:
        check_fields(self)
        parse_size(self.max_shard_size)
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise BadInputError(f"unknown device {self.device!r}", field="device", hint="Use cpu or cuda.")


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB', '1000000' -> bytes (decimal units as Hugging Face uses)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", text.upper())
    if not m:
        raise BadInputError(f"cannot read size {text!r}", field="max_shard_size",
                            hint="Write it like 5GB, 500MB or 2GiB.")
    unit = m.group(2).rstrip("B") or ""
    power = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit.rstrip("I")]
    mult = (1024 if unit.endswith("I") else 1000) ** power
    size = float(m.group(1)) * mult
    if not 0 < size < 2**63:
        raise BadInputError(f"size {text!r} must be positive and below 8 EiB", field="max_shard_size",
                            hint="Write it like 5GB.")
    return int(size)
