"""Serving: vLLM processes, recipes, memory plans."""

from typing import TYPE_CHECKING, Any

from qlift.serve.run import ServeInputs, run

if TYPE_CHECKING:
    from qlift.serve.launch import ServeOutcome
    from qlift.serve.options import ServeOptions

__all__ = ["ServeInputs", "ServeOptions", "ServeOutcome", "run"]
_HOME = {"ServeOptions": "options", "ServeOutcome": "launch"}


def __getattr__(name: str) -> Any:
    """On first use: serve's modules load recipes and hardware probes, which `qlift --help` does not need."""
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"qlift.serve.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
