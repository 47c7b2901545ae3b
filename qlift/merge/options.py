"""What a merge can be asked to do besides BASE, ADAPTERS and the output: the one definition
``merge_model`` takes and ``qlift merge``'s options are generated from."""

from __future__ import annotations

from dataclasses import dataclass, field

from qlift.options import check_fields

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
    tolerance: float = field(default=DEFAULT_TOLERANCE, metadata={"min": 0})
    """--verify fails above this max |logit delta| relative to the largest logit."""
    strict: bool = False
    """Fail (not warn) when an adapter names a different base model."""
    force: bool = False
    """Replace an existing output directory."""
    allow_pickle: bool = False
    """Accept adapter_model.bin (pickle) from a trusted source."""

    def __post_init__(self) -> None:
        check_fields(self)
