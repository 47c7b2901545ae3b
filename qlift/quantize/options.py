"""What a quantization can be asked to do besides MODEL and the output: the one definition
``quantize`` takes and ``qlift quantize``'s options are generated from (all but ``method``: --awq, --fp8,
``QuantizeOptions.from_switches``); its checks run on construction, so the CLI and a release's quantize
stage meet the same rules."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from qlift.errors import BadInputError
from qlift.options import Range, check_fields

Method = Literal["awq", "fp8"]


@dataclass(frozen=True)
class QuantizeOptions:
    method: Method = field(metadata={"choices": ("awq", "fp8")})
    """awq: AWQ W4A16, int4 asymmetric, group-wise (calibrated); fp8: FP8 dynamic, per-channel weights,
    per-token activations."""
    calib: Path | None = None
    """Calibration JSONL, one {'messages': [...]} or {'text': ...} per line (default: built-in set)."""
    num_samples: Annotated[int, Range(ge=1, le=1_000_000)] | None = None
    """Calibration samples (default: 32 on CPU, the whole set on CUDA)."""
    seq_len: Annotated[int, Range(ge=1, le=1 << 20)] | None = None
    """Tokens per calibration sample (default: 256 on CPU, 512 on CUDA)."""
    group_size: int | None = field(default=None, metadata={"choices": (None, 32, 64, 128), "none": "auto"})
    """AWQ group size; auto picks the largest that divides every quantized layer's input dim."""
    ignore: tuple[str, ...] = field(default=(), metadata={"metavar": "PATTERN"})
    """Keep a layer unquantized: module name or re:REGEX (repeatable). lm_head and embeddings always are."""
    device: str = field(default="auto", metadata={"choices": ("auto", "cpu", "cuda")})
    """Where llm-compressor runs."""
    threads: Annotated[int, Range(ge=1, le=4096)] | None = None
    """CPU threads for calibration (default: the CPUs this process may use, by affinity and cgroup quota)."""
    compute_dtype: str = field(default="auto", metadata={"choices": ("auto", "bfloat16", "float32")})
    """Calibration dtype on CPU; auto: float32 where the CPU has no bf16 units (AVX512-BF16 or AMX), else the
    model's own. The checkpoint is written in the model's dtype either way."""
    target_recipe: str | None = field(default=None, metadata={"metavar": "NAME"})
    """Warn about the hardware the model will be served on: a serving recipe, a GPU name, or cpu."""
    force: bool = False
    """Replace an existing output directory."""

    def __post_init__(self) -> None:
        check_fields(self)
        _check_regexes(self.ignore)
        if self.method == "fp8" and (self.calib or self.num_samples or self.seq_len or self.group_size):
            raise BadInputError("`calib`, `num_samples`, `seq_len` and `group_size` apply to `method=awq` only",
                                hint="FP8 dynamic needs no calibration; drop those options.")

    @classmethod
    def from_switches(cls, *, awq: bool, fp8: bool, **options: Any) -> QuantizeOptions:
        """The options from ``qlift quantize``'s flags, where the method is one of two switches, --awq or --fp8
        (exactly one; named ``method=awq`` and ``method=fp8`` here, the CLI says its flags); ``group_size`` with
        fp8 is refused, as a release's quantize stage refuses it."""
        if awq == fp8:
            if awq:
                raise BadInputError("`method=awq` and `method=fp8` together", hint="Pass only one of them.")
            raise BadInputError("choose a method", hint="Pass `method=awq` or `method=fp8`.")
        return cls(method="awq" if awq else "fp8", **options)


def _check_regexes(patterns: tuple[str, ...]) -> None:
    """``ignore``'s values: a ``re:`` pattern must compile (checked before any work)."""
    for pat in patterns:
        if pat.startswith("re:"):
            try:
                re.compile(pat[3:])
            except re.error as exc:
                raise BadInputError(f"{pat!r} is not a regular expression ({exc})", field="ignore",
                                    hint="Write re:REGEX (Python syntax) or a plain module name.") from None
