"""``qlift tune``: measure a grid of vLLM settings on this machine and write the best as a recipe.

Each point is the base recipe with ``--set`` and one combination of ``--grid`` values; vLLM's
defaults (only ``--set`` applied) are always a point of their own. A point the memory plan
says does not fit is skipped; a point whose server fails to start is recorded. Each other
point: start vLLM (the same config file ``qlift serve`` writes), ``qlift bench`` it, stop it.
The pick is the highest goodput among points that meet the SLO (>= 90% of a level's requests
good, and the p99 gap between streamed chunks within ``gap=`` when given); the recipe written
records every point, the hardware, the vLLM version and the date, and beside the client's
tokens/s the server's own (its ``vllm:generation_tokens_total`` counter).

One bench client (vLLM's, in a worker process) measures every point in turn.
The load is sized to the machine: a short probe on the first point's server measures its speed,
and the requests per level shrink (the same at every point) until a point's bench is expected
to fit ``point_budget_s``; a point that still runs past its time limit is cut, and the levels it
finished are kept. Interrupted (Ctrl-C, or SIGINT from a time limit), it picks among the points
measured so far.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from qlift.errors import BadInputError, ExternalToolError, QliftError
from qlift.hardware import Hardware, detect
from qlift.models.modeldir import ModelDir
from qlift.perf.bench import BENCH_WORKER, BenchResult, LevelResult, run_bench
from qlift.perf.counter import CounterRate, CounterSampler
from qlift.perf.options import BenchOptions, TuneOptions
from qlift.serve.launch import config_server, config_yaml, new_run_dir
from qlift.serve.options import ServeOptions
from qlift.serve.plan import fit_to_model, plan_memory
from qlift.serve.recipes import EngineSpec, Recipe, apply_overrides, load_recipe
from qlift.vllm.process import free_port, raise_open_files_limit
from qlift.vllm.worker import Worker

log = logging.getLogger(__name__)
SLO_ATTAINMENT = 0.9  # share of a level's requests that must meet every objective
PROBE_CONCURRENCY = 8  # the probe's concurrency and requests (at most the grid's highest level)
PROBE_OUTPUT_TOKENS = 32
MIN_TIMEOUT_S = 60.0  # a point's bench is never cut sooner than this


@dataclass
class LoadSize:
    """The bench load every point gets, sized by the probe; ``timeout_s`` cuts a point that runs long."""

    requests: int
    timeout_s: float
    note: str | None = None  # what the probe measured and what it changed
    probe_tokens_per_s: float | None = None


def estimate_s(levels: list[int], requests: int, output_tokens: int, probe_tps: float, probe_c: int) -> float:
    """Seconds for ``requests`` at each level, from the probe's rate: a level below the probe's
    concurrency gets its share of that rate, one above gets no more than it (a safe side)."""
    return sum(requests * output_tokens / (probe_tps * min(c, probe_c) / probe_c) for c in levels)


def size_load(levels: list[int], requests: int, output_tokens: int, probe_tps: float, probe_c: int,
              budget_s: float, timeout_s: float | None) -> LoadSize:
    """Requests per level so the expected bench fits ``budget_s`` (never fewer than the highest level);
    the time limit: ``timeout_s`` if given, else twice the expected time (at least MIN_TIMEOUT_S)."""
    floor = min(requests, max(levels))
    need = estimate_s(levels, requests, output_tokens, probe_tps, probe_c)
    sized = requests if need <= budget_s else max(floor, int(requests * budget_s / need))
    expected = estimate_s(levels, sized, output_tokens, probe_tps, probe_c)
    note = (f"probe: {probe_tps:.1f} output tok/s at concurrency {probe_c}; a point's bench is expected to take "
            f"~{expected:.0f} s")
    if sized < requests:
        note += f" with {sized} requests per level (cut from {requests} to fit --point-budget {budget_s:.0f} s)"
    limit = timeout_s if timeout_s is not None else max(MIN_TIMEOUT_S, 2 * expected)
    return LoadSize(sized, limit, note, probe_tps)


@dataclass
class TunePoint:
    label: str
    engine_args: dict[str, Any]  # as the server got them
    status: str  # measured | skipped | failed
    reason: str | None = None
    best: LevelResult | None = None  # the level with the highest goodput
    slo_met: bool = False
    levels: list[LevelResult] = field(default_factory=list)
    server: CounterRate | None = None  # the server's own generation counter over the whole bench
    cut: bool = False  # the bench reached its time limit: only the levels listed finished

    def client_tokens_per_s(self) -> float | None:
        """Every level's output tokens over every level's duration: the client's figure for what
        the server counter measured over the same bench."""
        secs = sum(lv.duration_s for lv in self.levels)
        return sum(lv.total_output_tokens for lv in self.levels) / secs if secs > 0 else None

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.label, "engine": self.engine_args, "status": self.status}
        if self.reason:
            out["reason"] = self.reason
        if self.best is not None:
            b = self.best
            out.update(slo_met=self.slo_met, best_concurrency=b.concurrency,
                       goodput_requests_per_s=round(b.goodput_requests_per_s, 4),
                       output_tokens_per_s=round(b.output_tokens_per_s, 2),
                       requests_per_s=round(b.requests_per_s, 4),
                       p99_ttft_ms=round(b.latency_ms["ttft"]["p99"], 1),
                       p99_tpot_ms=round(b.latency_ms["tpot"]["p99"], 2),
                       p99_e2el_ms=round(b.latency_ms["e2el"]["p99"], 1),
                       p99_chunk_gap_ms=round(b.latency_ms["itl"]["p99"], 2),
                       levels=[{"concurrency": lv.concurrency, "output_tokens_per_s": round(lv.output_tokens_per_s, 2),
                                "goodput_requests_per_s": round(lv.goodput_requests_per_s, 4),
                                "good_requests": lv.good_requests, "completed": lv.completed, "failed": lv.failed,
                                "p99_chunk_gap_ms": round(lv.latency_ms["itl"]["p99"], 2)}
                               for lv in self.levels])
        client = self.client_tokens_per_s()
        if self.server is not None:
            server_tps = self.server.tokens_per_s
            out["throughput_all_levels"] = {
                "client_output_tokens_per_s": round(client, 2) if client else None,
                "server_output_tokens_per_s": round(server_tps, 2) if server_tps else None,
                "server_generated_tokens": int(self.server.tokens),
                "client_output_tokens": sum(lv.total_output_tokens for lv in self.levels),
            }
        if self.cut:
            out["cut"] = True
        return out


@dataclass
class TuneResult:
    recipe_path: Path
    recipe: str
    chosen: str
    slo_met: bool
    points: list[TunePoint]
    hardware: str
    vllm_version: str | None
    plot: Path | None = None


def _pick_level(levels: list[LevelResult], slo: dict[str, float],
                gap_ms: float | None = None) -> tuple[LevelResult, bool]:
    def meets(lv: LevelResult) -> bool:
        return lv.completed > 0 and lv.good_requests >= SLO_ATTAINMENT * lv.requests and \
            (gap_ms is None or lv.latency_ms["itl"]["p99"] <= gap_ms)

    if not slo and gap_ms is None:
        return max(levels, key=lambda lv: lv.output_tokens_per_s), True
    ok = [lv for lv in levels if meets(lv)]
    return max(ok or levels, key=lambda lv: lv.goodput_requests_per_s), bool(ok)


def _points(base: Recipe, sets: list[str], grid: dict[str, list[Any]]) -> list[tuple[str, Recipe]]:
    defaults = apply_overrides(base.model_copy(update={"engine": EngineSpec.model_validate({})}), sets)
    points = [("vllm-defaults", defaults)]
    fixed = apply_overrides(base, sets)
    for combo in itertools.product(*grid.values()):
        overrides = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                     for k, v in zip(grid, combo, strict=True)]
        label = ",".join(f"{k}={v}" for k, v in zip(grid, combo, strict=True))
        points.append((label, apply_overrides(fixed, overrides)))
    return points


def _probe(base_url: str, bench: BenchOptions, worker: Worker, options: TuneOptions) -> LoadSize:
    """A short load on the first server up (few requests, few output tokens) to size every point's bench."""
    budget_s = options.point_budget
    c = min(PROBE_CONCURRENCY, max(bench.concurrency))
    probe = replace(bench, concurrency=(c,), requests=c, output_tokens=min(PROBE_OUTPUT_TOKENS, bench.output_tokens),
                    slo={}, timeout_s=budget_s)
    result = run_bench(base_url, "tune", probe, worker=worker)
    tps = result.levels[0].output_tokens_per_s if result.levels and result.levels[0].completed else 0.0
    if tps <= 0:
        raise ExternalToolError(f"the speed probe ({c} requests) did not finish within {budget_s:.0f} s", tool="vllm",
                                hint="Raise --point-budget, or lower --input-tokens/--output-tokens.")
    size = size_load(list(bench.concurrency), bench.requests, bench.output_tokens, tps, c, budget_s,
                     options.bench_timeout)
    log.info("tune: %s", size.note)
    return size


class BenchClient:
    """The bench worker the points share: one vLLM client import for the whole grid (13 s of a CPU core each
    on vllm-cpu's machines), started with the first server. A point whose bench failed or was cut may
    have left it busy: the next point gets a fresh one."""

    def __init__(self) -> None:
        self._worker: Worker | None = None

    def worker(self) -> Worker:
        if self._worker is not None and self._worker.proc.poll() is not None:  # it died between points
            self.discard()
        if self._worker is None:
            self._worker = Worker(BENCH_WORKER, name="bench", serial=True)
        return self._worker

    def discard(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None


def _measure(md: ModelDir, label: str, recipe: Recipe, hw: Hardware, options: TuneOptions, size: LoadSize | None,
             client: BenchClient) -> tuple[TunePoint, BenchResult | None, LoadSize | None]:
    """Start, bench and stop one point. ``size``: the load sized so far; None: probe this point's server first."""
    recipe, _ = fit_to_model(recipe, md)
    engine = recipe.engine.args()
    try:
        plan = plan_memory(md, recipe, hw)
    except QliftError as exc:
        return TunePoint(label, engine, "skipped", f"no memory plan: {exc.one_line()}"), None, size
    if not plan.fits:
        return TunePoint(label, engine, "skipped", f"qlift plan: {plan.verdict}"), None, size
    engine["dtype"] = plan.dtype  # the plan resolved "auto" (float32 on a CPU without bf16 units)
    run_dir = new_run_dir(f"tune-{label}")
    run_dir.mkdir(parents=True)
    port = free_port()
    (run_dir / "config.yaml").write_text(config_yaml(md.path.resolve(), "127.0.0.1", port, "tune", engine))
    env = {k: v for k, v in recipe.env.items()}
    server = config_server(md.path, run_dir, ServeOptions(host="127.0.0.1", port=port, served_model_name="tune"),
                           engine, env)
    bench = replace(options.bench(), tokenizer=str(md.path.resolve()))
    log.info("tune: %s: starting vLLM (log %s)", label, server.log_path)
    bench_worker = client.worker()  # the first point's: its vLLM import overlaps the server's start
    server.start()
    benching = False
    try:
        server.wait_ready(timeout=options.start_timeout)
        benching = True
        if size is None:
            size = _probe(server.base_url, bench, bench_worker, options)
        with CounterSampler(server.base_url) as sampler:
            load = replace(bench, requests=size.requests, timeout_s=size.timeout_s)
            result = run_bench(server.base_url, "tune", load, server_args=engine, worker=bench_worker)
        counted = sampler.stop()
    except ExternalToolError as exc:
        if benching:  # the worker may be mid-job
            client.discard()
        return TunePoint(label, engine, "failed", exc.one_line()), None, size
    finally:
        server.stop()
    if not result.complete:  # cut at its time limit: the worker may still be on the last level
        client.discard()
    if not result.levels:
        return TunePoint(label, engine, "failed", f"no benchmark level finished within {size.timeout_s:.0f} s",
                         server=counted, cut=True), result, size
    best, met = _pick_level(result.levels, bench.slo, options.gap_ms)
    reason = None
    if not result.complete:
        done = ", ".join(str(lv.concurrency) for lv in result.levels)
        reason = f"cut at its {size.timeout_s:.0f} s limit; measured concurrency {done} only"
        log.warning("tune: %s: %s", label, reason)
    return TunePoint(label, engine, "measured", reason, best, met, result.levels, counted,
                     cut=not result.complete), result, size


def tune(model: Path, out: Path, options: TuneOptions, plot: Path | None = None) -> TuneResult:
    """Measure every point of ``options`` for ``model`` and write the best as the recipe ``out``
    (``plot``: a PNG of the points)."""
    if out.suffix not in (".yaml", ".yml"):
        raise BadInputError(f"the recipe path {out} must end in .yaml", field="-o", hint="Example: -o recipes/my.yaml.")
    md = ModelDir.open(model)
    md.require_weights()
    base = load_recipe(options.recipe)
    hw = detect()
    limit_note = raise_open_files_limit()
    if limit_note:
        log.info("tune: %s", limit_note)
    points: list[TunePoint] = []
    vllm_version: str | None = None
    size: LoadSize | None = None
    todo = _points(base, list(options.sets), options.grid_values())
    client = BenchClient()
    try:
        for i, (label, recipe) in enumerate(todo):
            try:
                point, result, size = _measure(md, label, recipe, hw, options, size, client)
            except KeyboardInterrupt:  # Ctrl-C, or SIGINT at a time limit: the recipe comes from the points measured
                if not any(p.best is not None for p in points):
                    raise  # nothing to choose from: exit 130 like any interrupted command
                log.warning("tune: interrupted at %s; choosing among the points measured", label)
                points += [TunePoint(lb, r.engine.args(), "skipped", "interrupted") for lb, r in todo[i:]]
                break
            vllm_version = vllm_version or (result.vllm_version if result else None)
            log.info("tune: %s: %s%s", label, point.status, f" ({point.reason})" if point.reason else
                     f" - goodput {point.best.goodput_requests_per_s:.2f} req/s, "
                     f"{point.best.output_tokens_per_s:.1f} tok/s" if point.best else "")
            points.append(point)
    finally:
        client.discard()
    measured = [p for p in points if p.best is not None]
    if not measured:
        reasons = "; ".join(f"{p.label}: {p.reason}" for p in points)
        raise ExternalToolError(f"no grid point could be measured ({reasons})", tool="vllm",
                                hint="Read the point logs under $QLIFT_HOME/runs.")
    met = [p for p in measured if p.slo_met]
    score = (lambda p: p.best.goodput_requests_per_s) if options.slo else (lambda p: p.best.output_tokens_per_s)
    chosen = max(met or measured, key=score)  # type: ignore[union-attr]
    if not met:
        log.warning("tune: no point met the SLO; writing the one with the highest goodput (%s)", chosen.label)
    bench = options.bench()
    load = {"concurrency": list(bench.concurrency), "requests": size.requests if size else bench.requests,
            "input_tokens": bench.input_tokens, "output_tokens": bench.output_tokens,
            "timeout_s": size.timeout_s if size else options.bench_timeout, "point_budget_s": options.point_budget,
            "probe": size.note if size else None}
    recipe_data = _recipe_data(out.stem, base, chosen, points, hw, vllm_version, options, load)
    _write_recipe(out, recipe_data)
    if plot is not None:
        from qlift.perf.plot import plot_pareto

        marks = [(p.label, p.best.latency_ms["e2el"]["p99"] / 1000, p.best.output_tokens_per_s, p is chosen)
                 for p in measured if p.best]
        plot_pareto(marks, plot, title=f"qlift tune {md.path.name}: {options.workload}, {hw.describe()}")
    return TuneResult(out, out.stem, chosen.label, chosen.slo_met, points, hw.describe(), vllm_version, plot)


def _recipe_data(name: str, base: Recipe, chosen: TunePoint, points: list[TunePoint], hw: Hardware,
                 vllm_version: str | None, options: TuneOptions, load: dict[str, Any]) -> dict[str, Any]:
    """The recipe: the chosen point's engine arguments, and every point measured (``load``: the bench
    every point got)."""
    workload, slo, gap_ms = options.workload, options.bench().slo, options.gap_ms
    date = datetime.now(UTC).isoformat(timespec="seconds")
    best = chosen.best
    assert best is not None
    objectives = [f"{k} <= {v:g} ms" for k, v in slo.items()]
    if gap_ms is not None:
        objectives.append(f"p99 inter-chunk gap <= {gap_ms:g} ms")
    slo_text = ", ".join(objectives) or "none (highest output tok/s)"
    server_tps = chosen.server.tokens_per_s if chosen.server else None
    server_text = f"; the server's own counter: {server_tps:.1f} tok/s over the whole bench" if server_tps else ""
    return {
        "name": name,
        "description": f"Tuned by qlift tune from {base.name} for {workload} on {hw.describe()}.",
        "workload": workload,
        "hardware": base.hardware.model_dump(mode="json"),
        "engine": _servable(chosen.engine_args),
        "env": dict(base.env),
        "sources": [
            f"qlift tune, {date}, vLLM {vllm_version}, {hw.describe()}: {len(points)} points "
            f"({sum(p.status == 'measured' for p in points)} measured); chose {chosen.label}: goodput "
            f"{best.goodput_requests_per_s:.3f} req/s, {best.output_tokens_per_s:.1f} output tok/s at concurrency "
            f"{best.concurrency}, p99 inter-chunk gap {best.latency_ms['itl']['p99']:.1f} ms (SLO {slo_text})"
            f"{server_text}.",
        ],
        "measurements": {
            "date": date, "tool": "qlift tune", "vllm_version": vllm_version, "hardware": hw.describe(),
            "base_recipe": base.name, "workload": workload, "slo_ms": slo, "slo_attainment": SLO_ATTAINMENT,
            "slo_p99_chunk_gap_ms": gap_ms,
            "bench": load, "chosen": chosen.label,
            "points": [p.summary() for p in points],
        },
    }


def _servable(engine: dict[str, Any]) -> dict[str, Any]:
    """The chosen point's arguments as a recipe serves them: capacity runs' random weights
    (``--set load_format=dummy``) stay in the measurements, never in the recipe."""
    return {k: v for k, v in engine.items() if not (k == "load_format" and v == "dummy")}


def _write_recipe(out: Path, data: dict[str, Any]) -> None:
    """Validate as a recipe (schema, vLLM argument names), then write via a temp file and a rename."""
    from qlift.serve.recipes import parse_recipe

    data = json.loads(json.dumps(data))  # plain copies: no YAML anchors where two places share a dict
    parse_recipe(data, path=out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
    tmp.replace(out)
