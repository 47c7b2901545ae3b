"""qlift tune."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from qlift.cli.output import emit, json_option
from qlift.cli.params import SECONDS, count

if TYPE_CHECKING:
    from qlift.perf.tune import TuneResult


@click.command("tune")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--recipe", "-r", "base_recipe", required=True, metavar="NAME|FILE",
              help="Base recipe: its hardware match, environment and engine arguments the grid does not set.")
@click.option("--grid", "grid", multiple=True, required=True, metavar="KEY=V1,V2",
              help="An engine argument (vLLM's name) and the values to try. "
                   "Repeatable: the grid is every combination.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="An engine argument fixed at every point, vLLM's defaults point too (e.g. enforce_eager=true).")
@click.option("--workload", type=click.Choice(["chat", "long-doc"]), default="chat", show_default=True,
              help="chat: 256 prompt / 256 output tokens; long-doc: 4096 / 256 "
                   "(override with --input/--output-tokens).")
@click.option("--slo", help="Objectives for goodput, e.g. ttft=500ms,tpot=50ms (without: the highest tok/s wins).")
@click.option("--concurrency", default="1,8,32", show_default=True, help="Concurrency levels benched at each point.")
@click.option("--requests", type=count(1, 1_000_000), default=64, show_default=True, help="Requests per level.")
@click.option("--input-tokens", type=count(1, 1 << 20), help="Prompt tokens per request (default: the workload's).")
@click.option("--output-tokens", type=count(1, 1 << 20), help="Output tokens per request (default: the workload's).")
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="The recipe to write, e.g. recipes/chat-mygpu.yaml (its name is the file name).")
@click.option("--force", is_flag=True, help="Replace an existing recipe file.")
@click.option("--plot", type=click.Path(path_type=Path), help="Write a PNG of the points (Pareto front).")
@click.option("--start-timeout", type=SECONDS, default=900, show_default=True,
              help="Seconds a point's server may take to answer /health.")
@click.option("--bench-timeout", type=SECONDS, default=1800, show_default=True, help="Seconds for one point's bench.")
@json_option
def tune_cmd(model: Path, base_recipe: str, grid: tuple[str, ...], sets: tuple[str, ...], workload: str,
             slo: str | None, concurrency: str, requests: int, input_tokens: int | None, output_tokens: int | None,
             out: Path, force: bool, plot: Path | None, start_timeout: float, bench_timeout: float) -> None:
    """Measure a grid of vLLM settings for MODEL and write the best as a recipe.

    Every combination of the --grid values (on top of --recipe and --set) is one point,
    and vLLM's defaults (only --set applied) are always measured too. Points `qlift plan`
    says do not fit are skipped; a point whose server fails to start is recorded. Each
    other point is started, benched with `qlift bench` and stopped. The recipe gets the
    point with the highest goodput that meets --slo, and records every point's figures,
    the hardware, the vLLM version and the date.

    \b
    Examples:
      qlift tune ./merged --recipe chat-h200 --grid max_num_seqs=256,1024 \\
          --grid max_num_batched_tokens=8192,16384 --slo ttft=500ms,tpot=50ms -o recipes/chat-h200-tuned.yaml
      qlift tune ./smollm2 --recipe cpu --set enforce_eager=true --grid max_num_seqs=4,16 \\
          --concurrency 4 --requests 8 --input-tokens 32 --output-tokens 16 -o /tmp/cpu-tuned.yaml --json
    """
    from qlift.cli.bench import parse_levels
    from qlift.fsutil import check_output_path
    from qlift.perf.slo import parse_slo
    from qlift.perf.tune import parse_grid, tune

    check_output_path(out, force=force, inputs=[model])
    result = tune(model, base_recipe=base_recipe, grid=parse_grid(list(grid)), out=out, sets=list(sets),
                  workload=workload, slo=parse_slo(slo), concurrency=parse_levels(concurrency), requests=requests,
                  input_tokens=input_tokens, output_tokens=output_tokens, start_timeout=start_timeout,
                  bench_timeout=bench_timeout, plot=plot)
    emit(result, lambda: _print(result))


def _print(r: TuneResult) -> None:
    click.echo(f"{r.hardware}, vLLM {r.vllm_version or '?'}")
    for p in r.points:
        mark = "*" if p.label == r.chosen else " "
        if p.best is None:
            click.echo(f"{mark} {p.label:<48} {p.status}: {p.reason}")
        else:
            b = p.best
            click.echo(f"{mark} {p.label:<48} goodput {b.goodput_requests_per_s:7.2f} req/s  "
                       f"{b.output_tokens_per_s:8.1f} tok/s  p99 e2e {b.latency_ms['e2el']['p99'] / 1000:6.2f} s  "
                       f"c={b.concurrency}{'' if p.slo_met else '  (SLO not met)'}")
    click.echo(f"wrote {r.recipe_path} (chose {r.chosen}{'' if r.slo_met else '; no point met the SLO'}); "
               f"`qlift recipes show {r.recipe_path}` shows it")
    if r.plot:
        click.echo(f"plot: {r.plot}")
