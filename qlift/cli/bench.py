"""qlift bench."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from qlift.cli.options import click_options
from qlift.cli.output import emit, json_option
from qlift.cli.params import URL
from qlift.perf.options import BenchOptions

if TYPE_CHECKING:
    from qlift.perf.bench import BenchResult


@click.command("bench")
@click.option("--endpoint", required=True, type=URL, help="Base URL of the OpenAI-compatible vLLM server.")
@click.option("--model", required=True, help="Served model name.")
@click_options(BenchOptions)
@click.option("--baseline", type=click.Path(path_type=Path), help="An earlier result JSON: print ratios against it.")
@click.option("--plot", type=click.Path(path_type=Path),
              help="Write a PNG: tok/s and goodput, TTFT, TPOT and end-to-end latency per concurrency level.")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), help="Write the result JSON here.")
@click.option("--force", is_flag=True, help="Replace an existing -o or --plot file.")
@json_option
def bench_cmd(endpoint: str, model: str, baseline: Path | None, plot: Path | None, out: Path | None, force: bool,
              **options: Any) -> None:
    """Benchmark a running vLLM server with vLLM's own client, per concurrency level.

    Reports TTFT, TPOT, ITL and end-to-end latency (mean, p50/p95/p99), requests/s,
    output tok/s, goodput under --slo and errors for each level. The result JSON records the
    hardware, vLLM version, model and what the server says about itself; --baseline prints
    this run's ratios against an earlier result. Only the endpoint you name gets traffic.
    A level where every request failed, or a --timeout reached before any level finished,
    exits 8 once the result is written (-o, with complete: false on a timeout).

    \b
    Examples:
      qlift bench --endpoint http://127.0.0.1:8000 --model smollm2 --concurrency 1,4 --requests 16
      qlift bench --endpoint http://127.0.0.1:8000 --model chat --slo ttft=500ms,tpot=50ms -o run.json --plot run.png
      qlift bench --endpoint http://127.0.0.1:8000 --model chat --baseline before.json --json
      qlift bench --endpoint http://gateway:9000 --model chat --tokenizer ./merged   # a remote or routed server
    """
    from qlift.fsutil import write_json_atomic
    from qlift.perf import BenchInputs, run
    from qlift.perf.bench import check_outcome, compare, load_result
    from qlift.serialize import to_jsonable

    opts = BenchOptions(**options)
    check_outputs(out, plot, inputs=[p for p in (opts.dataset, baseline) if p is not None], force=force)
    base = load_result(baseline) if baseline else None
    result = run(BenchInputs(endpoint, model), opts)
    if base is not None and baseline is not None:
        result.baseline = compare(result, base, baseline)
    if out:
        write_json_atomic(out, to_jsonable(result))
    if plot and result.levels:
        from qlift.perf.plot import plot_bench

        plot_bench(result, plot, baseline=base)
    emit(result, lambda: print_result(result))
    check_outcome(result, opts.timeout_s)


def check_outputs(out: Path | None, plot: Path | None, *, inputs: list[Path], force: bool) -> None:
    """Before any load: -o and --plot are neither an input (--dataset, --baseline) nor each other,
    and replace an existing file only with --force."""
    from qlift.errors import BadInputError
    from qlift.fsutil import check_output_path

    written = [p for p in (out, plot) if p is not None]
    for path in written:
        check_output_path(path, force=force, inputs=inputs)
        if path.is_dir():
            raise BadInputError(f"{path} is a directory; qlift bench writes a file there", hint="Pass a file path.")
    if out is not None and plot is not None and out.resolve() == plot.resolve():
        raise BadInputError(f"-o and --plot are both {out}", hint="Give the result JSON and the PNG different paths.")


def print_result(r: BenchResult) -> None:
    click.echo(f"{r.model} at {r.endpoint}, vLLM {r.vllm_version or '?'}, {r.hardware['description']}")
    slo = ",".join(f"{k}<={v:g}ms" for k, v in r.slo_ms.items()) or "none"
    click.echo(f"{'conc':>5} {'req/s':>8} {'out tok/s':>10} {'ttft p50/p99 ms':>17} {'tpot p50/p99 ms':>17} "
               f"{'e2e p50/p99 s':>15} {'goodput req/s':>14} {'failed':>7}   (SLO {slo})")
    from qlift.perf.plot import MIN_P99_REQUESTS

    for lv in r.levels:
        t, p, e = lv.latency_ms["ttft"], lv.latency_ms["tpot"], lv.latency_ms["e2el"]
        thin = lv.requests < MIN_P99_REQUESTS  # as the plot: a p99 of a few requests is their maximum

        def p99(stats: dict[str, float], spec: str, scale: float = 1.0, *, thin: bool = thin) -> str:
            return "-" if thin else format(stats["p99"] / scale, spec)

        click.echo(f"{lv.concurrency:>5} {lv.requests_per_s:>8.2f} {lv.output_tokens_per_s:>10.1f} "
                   f"{t['p50']:>8.0f}/{p99(t, '.0f'):<8} {p['p50']:>8.1f}/{p99(p, '.1f'):<8} "
                   f"{e['p50'] / 1000:>7.2f}/{p99(e, '.2f', 1000):<7} {lv.goodput_requests_per_s:>14.2f} "
                   f"{lv.failed:>7}")
        for err in lv.errors:
            click.echo(f"      error: {err[:160]}", err=True)
    if any(lv.requests < MIN_P99_REQUESTS for lv in r.levels):
        click.echo(f"p99 -: fewer than {MIN_P99_REQUESTS} requests at that level, too few for a p99 "
                   "(--requests raises it; the JSON keeps the raw figure)")
    if not r.complete:
        click.echo("stopped at the time limit: later levels are missing", err=True)
    if r.baseline:
        click.echo(f"against {r.baseline['path']} ({r.baseline['date']}):")
        for row in r.baseline["ratios"]:
            parts = [f"{k} x{v:.3f}" for k, v in row.items() if k != "concurrency" and v is not None]
            click.echo(f"  c={row['concurrency']}: " + ", ".join(parts))
