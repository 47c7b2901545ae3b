"""The quantize stage's entry point: ``run(QuantizeInputs, QuantizeOptions) -> QuantizeResult``.

Progress goes to the log unless the caller passes its own status and per-layer progress callbacks
(``qlift quantize`` and a release's quantize stage do): presentation, not inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qlift.models.ref import ModelRef

if TYPE_CHECKING:
    from qlift.quantize.api import QuantizeResult
    from qlift.quantize.options import QuantizeOptions


@dataclass(frozen=True)
class QuantizeInputs:
    """What a quantization consumes: the model's ``ModelRef`` (its directory; the hash is not read), and where the
    quantized checkpoint goes."""

    model: ModelRef
    output: Path


def run(inputs: QuantizeInputs, options: QuantizeOptions, *, on_status: Callable[[str], None] | None = None,
        on_step: Callable[[int, int], None] | None = None, echo_log: bool = False) -> QuantizeResult:
    """Quantize ``inputs.model`` into ``inputs.output`` (atomically) as ``options`` say; ``on_status`` gets stage
    messages (default: the log), ``on_step(done, total)`` AWQ's per-layer progress, ``echo_log`` the tool's log."""
    from qlift.quantize.api import quantize

    return quantize(inputs.model.base, inputs.output, options, on_status=on_status,
                    on_step=on_step, echo_log=echo_log)
