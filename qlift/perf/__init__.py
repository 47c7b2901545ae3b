"""Throughput work on vLLM: offline batch inference, serving benchmarks, recipe tuning."""

from typing import TYPE_CHECKING, Any

from qlift.perf.run import BatchInputs, BenchInputs, TuneInputs, run

if TYPE_CHECKING:
    from qlift.perf.batch import BatchResult
    from qlift.perf.bench import BenchResult
    from qlift.perf.options import BatchOptions, BenchOptions, TuneOptions
    from qlift.perf.tune import TuneResult

__all__ = [
    "BatchInputs",
    "BatchOptions",
    "BatchResult",
    "BenchInputs",
    "BenchOptions",
    "BenchResult",
    "TuneInputs",
    "TuneOptions",
    "TuneResult",
    "run",
]
_HOME = {
    "BatchOptions": "options",
    "BatchResult": "batch",
    "BenchOptions": "options",
    "BenchResult": "bench",
    "TuneOptions": "options",
    "TuneResult": "tune",
}


def __getattr__(name: str) -> Any:
    """On first use: bench, batch and tune load vLLM's client and engine stacks, which `qlift --help` does not need."""
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"qlift.perf.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
