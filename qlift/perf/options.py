"""What a benchmark, a tuning run and a batch job can be asked to do: ``BenchOptions`` (the load
``run_bench`` sends; ``qlift bench``'s options), ``TuneOptions`` (what ``tune`` measures and how;
``qlift tune``'s options) and ``BatchOptions`` (how ``run_batch`` runs a file; ``qlift batch``'s
options), each the one definition its command's options are generated from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml

from qlift.errors import BadInputError
from qlift.options import Range, Seconds, check_fields
from qlift.perf.slo import parse_slo

WORKLOAD_TOKENS = {"chat": (256, 256), "long-doc": (4096, 256)}  # input, output tokens per request
_GAP_KEYS = ("gap", "chunk_gap")


def parse_levels(text: str) -> tuple[int, ...]:
    """``concurrency``'s text: ``1,8,32``."""
    try:
        levels = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        levels = ()
    if not levels or any(c < 1 for c in levels):
        raise BadInputError(f"{text!r} is not a list of positive integers", field="concurrency",
                            hint="Example: 1,8,32.")
    return levels


def parse_tune_slo(text: str | None) -> tuple[dict[str, float], float | None]:
    """``--slo ttft=500ms,tpot=50ms,gap=100ms``: per-request objectives (as ``qlift bench``), and the
    p99 gap between streamed chunks in ms (``gap``: a level's p99 over every chunk of every request)."""
    gap: float | None = None
    rest = []
    for part in (text or "").split(","):
        key, sep, raw = part.partition("=")
        if key.strip().lower() in _GAP_KEYS and sep:
            if gap is not None:
                raise BadInputError(f"`slo` sets {key.strip()} twice", field="slo", hint="Give each objective once.")
            gap = parse_slo(f"e2e={raw}")["e2el"]
        elif part.strip():
            rest.append(part)
    slo = parse_slo(",".join(rest))
    if any(v <= 0 for v in slo.values()) or (gap is not None and gap <= 0):
        raise BadInputError("an SLO limit of 0 can never be met", field="slo", hint="Example: gap=100ms.")
    return slo, gap


def tune_objectives(text: str | None) -> dict[str, float]:
    """``qlift tune --slo`` as one dict: ``parse_tune_slo``'s objectives, and the chunk gap as ``gap``."""
    slo, gap = parse_tune_slo(text)
    return {**slo, **({"gap": gap} if gap is not None else {})}


def parse_grid(items: list[str] | tuple[str, ...]) -> dict[str, list[Any]]:
    """``--grid max_num_seqs=16,64`` (repeatable) as {vLLM name: [values]} (values parsed as YAML scalars)."""
    from qlift.vllm.engine_args import check_arg_name

    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise BadInputError(f"{item!r} is not KEY=V1,V2,...", field="grid",
                                hint="Example: max_num_seqs=16,64,256.")
        name = check_arg_name(key.strip(), field="grid")
        if name in grid:
            raise BadInputError(f"`grid` sets {name} twice", field="grid",
                                hint=f"Give all its values once: {name}=V1,V2,...")
        grid[name] = [yaml.safe_load(v) for v in raw.split(",") if v.strip()]
    return grid


@dataclass(frozen=True)
class BenchOptions:
    concurrency: tuple[int, ...] = field(default=(1, 8, 32), metadata={"parse": parse_levels})
    """Concurrency levels, comma-separated."""
    requests: Annotated[int, Range(ge=1, le=1_000_000)] = 64
    """Requests per level."""
    input_tokens: Annotated[int, Range(ge=1, le=1 << 20)] = 256
    """Prompt tokens per request (random prompts; ignored with --dataset)."""
    output_tokens: Annotated[int, Range(ge=1, le=1 << 20)] = 256
    """Output tokens per request (EOS ignored, so every request generates them all)."""
    dataset: Path | None = None
    """JSONL of {"prompt": ...} rows instead of random."""
    slo: dict[str, float] = field(default_factory=dict, metadata={"parse": parse_slo})
    """Service-level objectives for goodput, e.g. ttft=500ms,tpot=50ms,e2e=10s."""
    tokenizer: str | None = field(default=None, metadata={"metavar": "DIR|ORG/REPO"})
    """Tokenizer for the prompts (default: the server's model directory, or that repo in the local hub cache;
    otherwise required)."""
    seed: Annotated[int, Range(ge=0, le=2**31 - 1)] = 0
    """Seed of the random prompts."""
    timeout_s: Seconds = field(default=1800, metadata={"flag": "--timeout"})
    """Seconds for all levels; levels finished by then are kept."""

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise BadInputError("needs positive integers", field="concurrency", hint="Example: 1,8,32.")


@dataclass(frozen=True)
class TuneOptions:
    recipe: str = field(metadata={"short": "-r", "metavar": "NAME|FILE"})
    """Base recipe: its hardware match, environment and engine arguments the grid does not set."""
    grid: tuple[str, ...] = field(metadata={"metavar": "KEY=V1,V2"})
    """A vLLM argument, engine or server (vLLM's name, e.g. max_num_seqs, api_server_count, stream_interval), and
    the values to try. Repeatable, each key once: the grid is every combination."""
    sets: tuple[str, ...] = field(default=(), metadata={"flag": "--set", "metavar": "KEY=VALUE"})
    """An engine argument fixed at every point, vLLM's defaults point too (e.g. enforce_eager=true)."""
    workload: str = field(default="chat", metadata={"choices": tuple(WORKLOAD_TOKENS)})
    """chat: 256 prompt / 256 output tokens; long-doc: 4096 / 256 (override with --input/--output-tokens)."""
    slo: dict[str, float] = field(default_factory=dict, metadata={"parse": tune_objectives})
    """Objectives, e.g. ttft=500ms,tpot=50ms,gap=100ms (gap: the p99 time between streamed chunks of a level).
    Without: the highest tok/s wins."""
    concurrency: tuple[int, ...] = field(default=(1, 8, 32), metadata={"parse": parse_levels})
    """Concurrency levels benched at each point."""
    requests: Annotated[int, Range(ge=1, le=1_000_000)] = 64
    """Requests per level."""
    input_tokens: Annotated[int, Range(ge=1, le=1 << 20)] | None = None
    """Prompt tokens per request (default: the workload's)."""
    output_tokens: Annotated[int, Range(ge=1, le=1 << 20)] | None = None
    """Output tokens per request (default: the workload's)."""
    start_timeout: Seconds = 900
    """Seconds a point's server may take to answer /health."""
    point_budget: Seconds = 300
    """Seconds of load one point's bench is sized to: a short probe measures this machine's speed first, and
    fewer --requests per level are sent (the same at every point) when needed."""
    bench_timeout: Seconds | None = None
    """Cut a point's bench after this many seconds, keeping the levels it finished (default: twice the time the
    probe expects)."""

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.grid:
            raise BadInputError("give at least one KEY=V1,V2", field="grid",
                                hint="Example: max_num_seqs=16,64.")
        self.grid_values()

    def grid_values(self) -> dict[str, list[Any]]:
        return parse_grid(self.grid)

    @property
    def gap_ms(self) -> float | None:
        """The p99 inter-chunk gap objective (``gap`` in ``slo``)."""
        return self.slo.get("gap")

    def bench(self) -> BenchOptions:
        """The load every point gets (before the probe sizes its requests per level)."""
        default_in, default_out = WORKLOAD_TOKENS[self.workload]
        return BenchOptions(concurrency=self.concurrency, requests=self.requests,
                            input_tokens=self.input_tokens or default_in,
                            output_tokens=self.output_tokens or default_out,
                            slo={k: v for k, v in self.slo.items() if k != "gap"})


@dataclass(frozen=True)
class BatchOptions:
    recipe: str = field(default="auto", metadata={"short": "-r", "metavar": "NAME|auto|FILE"})
    """Recipe for the engine's arguments (`qlift recipes list`)."""
    sets: tuple[str, ...] = field(default=(), metadata={"flag": "--set", "metavar": "KEY=VALUE"})
    """Override a vLLM engine argument (vLLM's name). Repeatable."""
    max_tokens: Annotated[int, Range(ge=1, le=1 << 24)] = 256
    """Output tokens per row, unless the row sets max_tokens."""
    temperature: Annotated[float, Range(ge=0)] | None = None
    """Sampling temperature, unless the row sets one (default: vLLM's, 1.0)."""
    resume: bool = False
    """Keep OUT's rows whose id and request are unchanged; run the rest, drop ids no longer in IN."""
    force: bool = False
    """Replace an existing OUT."""
    ray_address: str | None = field(default=None, metadata={"flag": "--ray", "metavar": "ADDRESS"})
    """Run on an existing Ray cluster (Ray Data, one vLLM engine per GPU or CPU slot); 'local' starts one here.
    Needs `pip install 'qlift[ray]'`."""
    timeout_s: Seconds = field(default=24 * 3600, metadata={"flag": "--timeout"})
    """Seconds for the whole job."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.resume and self.force:
            raise BadInputError("resume and force contradict each other", field="resume", hint="Pass one of them.")
