"""Quantization with llm-compressor in its own managed environment."""

from typing import TYPE_CHECKING

from qlift.lazy import lazy_exports
from qlift.quantize.run import QuantizeInputs, run

if TYPE_CHECKING:
    from qlift.quantize.api import QuantizeResult
    from qlift.quantize.options import QuantizeOptions

__all__ = ["QuantizeInputs", "QuantizeOptions", "QuantizeResult", "run"]
_HOME = {"QuantizeOptions": "options", "QuantizeResult": "api"}

# On first use: the worker imports this package inside the tool environment, which has none of the stage.
__getattr__ = lazy_exports(__name__, _HOME)
