"""Throughput work on vLLM: offline batch inference, serving benchmarks, recipe tuning."""

from typing import TYPE_CHECKING

from qlift.lazy import lazy_exports
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

# On first use: bench, batch and tune load vLLM's client and engine stacks, which `qlift --help` does not need.
__getattr__ = lazy_exports(__name__, _HOME)
