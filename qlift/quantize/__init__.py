"""Quantization with llm-compressor in its own managed environment."""

from typing import TYPE_CHECKING, Any

from qlift.quantize.run import QuantizeInputs, run

if TYPE_CHECKING:
    from qlift.quantize.api import QuantizeResult
    from qlift.quantize.options import QuantizeOptions

__all__ = ["QuantizeInputs", "QuantizeOptions", "QuantizeResult", "run"]
_HOME = {"QuantizeOptions": "options", "QuantizeResult": "api"}


def __getattr__(name: str) -> Any:
    """On first use: the worker imports this package inside the tool environment, which has none of the stage."""
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"qlift.quantize.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
