"""The perf package's entry point for its three stages: ``run(inputs, options)`` dispatches on the options.

``BenchOptions`` with ``BenchInputs`` benches a server (``BenchResult``), ``BatchOptions`` with ``BatchInputs``
runs offline batch inference (``BatchResult``), ``TuneOptions`` with ``TuneInputs`` tunes a recipe
(``TuneResult``). One function, typed per stage through overloads, so the package has the one entry point
every stage package has; a mismatched pair is a ``BadInputError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, overload

from qlift.errors import BadInputError
from qlift.perf.options import BatchOptions, BenchOptions, TuneOptions

if TYPE_CHECKING:
    from qlift.perf.batch import BatchResult
    from qlift.perf.bench import BenchResult
    from qlift.perf.tune import TuneResult


@dataclass(frozen=True)
class BenchInputs:
    """The server to bench (an OpenAI-compatible base URL) and the model name it serves."""

    endpoint: str
    model: str


@dataclass(frozen=True)
class BatchInputs:
    """The model directory, the JSONL of requests, and where the results go."""

    model: Path
    input: Path
    output: Path


@dataclass(frozen=True)
class TuneInputs:
    """The model directory, where the tuned recipe goes, and optionally a plot of the points measured."""

    model: Path
    output: Path
    plot: Path | None = None


PerfInputs = BenchInputs | BatchInputs | TuneInputs
PerfOptions = BenchOptions | BatchOptions | TuneOptions


@overload
def run(inputs: BenchInputs, options: BenchOptions) -> BenchResult: ...
@overload
def run(inputs: BatchInputs, options: BatchOptions) -> BatchResult: ...
@overload
def run(inputs: TuneInputs, options: TuneOptions) -> TuneResult: ...
def run(inputs: PerfInputs, options: PerfOptions) -> BenchResult | BatchResult | TuneResult:
    """Bench, batch or tune, as the options' type says."""
    if isinstance(options, BenchOptions) and isinstance(inputs, BenchInputs):
        from qlift.perf.bench import run_bench

        return run_bench(inputs.endpoint, inputs.model, options)
    if isinstance(options, BatchOptions) and isinstance(inputs, BatchInputs):
        from qlift.perf.batch import run_batch

        return run_batch(inputs.model, inputs.input, inputs.output, options)
    if isinstance(options, TuneOptions) and isinstance(inputs, TuneInputs):
        from qlift.perf.tune import tune

        return tune(inputs.model, inputs.output, options, plot=inputs.plot)
    raise BadInputError(f"perf run: {type(inputs).__name__} with {type(options).__name__}",
                        hint="Pair BenchInputs/BenchOptions, BatchInputs/BatchOptions or TuneInputs/TuneOptions.")
