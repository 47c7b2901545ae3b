"""The quantize stage's entry point: ``run(QuantizeInputs, QuantizeOptions) -> QuantizeResult``.

Progress goes to the log; ``qlift quantize`` and a release's quantize stage call ``api.quantize`` with their
own status and per-layer progress callbacks, which are presentation, not inputs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qlift.quantize.api import QuantizeResult
    from qlift.quantize.options import QuantizeOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QuantizeInputs:
    """What a quantization consumes: the model directory, and where the quantized checkpoint goes."""

    model: Path
    output: Path


def run(inputs: QuantizeInputs, options: QuantizeOptions) -> QuantizeResult:
    """Quantize ``inputs.model`` into ``inputs.output`` (atomically) as ``options`` say."""
    from qlift.quantize.api import quantize

    return quantize(inputs.model, inputs.output, options, on_status=lambda msg: log.info("%s", msg))
