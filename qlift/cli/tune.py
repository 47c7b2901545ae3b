"""qlift tune."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from qlift.cli.options import click_options
from qlift.cli.output import emit, json_option
from qlift.perf.options import TuneOptions

if TYPE_CHECKING:
    from qlift.perf.tune import TuneResult


@click.command("tune")
@click.argument("model", type=click.Path(path_type=Path))
@click_options(TuneOptions)
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="The recipe to write, e.g. recipes/chat-mygpu.yaml (its name is the file name).")
@click.option("--force", is_flag=True, help="Replace an existing recipe file.")
@click.option("--plot", type=click.Path(path_type=Path), help="Write a PNG of the points (Pareto front).")
@json_option
def tune_cmd(model: Path, out: Path, force: bool, plot: Path | None, **options: Any) -> None:
    """Measure a grid of vLLM settings for MODEL and write the best as a recipe.

    Every combination of the --grid values (on top of --recipe and --set) is one point,
    and vLLM's defaults (only --set applied) are always measured too. Points `qlift plan`
    says do not fit are skipped; a point whose server fails to start is recorded. Each
    other point is started, benched with `qlift bench` and stopped, the server's own
    generated-tokens counter read beside the client's figures. A short probe on the first
    server sizes every point's load to --point-budget; a point past its time limit is cut,
    keeping what it measured. The recipe gets the point with the highest goodput that meets
    --slo, and records every point's figures, the hardware, the vLLM version and the date.

    \b
    Examples:
      qlift tune ./merged --recipe chat-h200 --grid max_num_seqs=256,1024 \\
          --grid max_num_batched_tokens=8192,16384 --slo ttft=500ms,tpot=50ms -o recipes/chat-h200-tuned.yaml
      qlift tune ./merged --recipe chat-h200 --grid api_server_count=1,4 --grid stream_interval=1,8 \\
          --slo tpot=60ms,gap=100ms -o recipes/chat-h200-frontend.yaml
      qlift tune ./smollm2 --recipe cpu --set enforce_eager=true --grid max_num_seqs=4,16 \\
          --concurrency 4 --requests 8 --input-tokens 32 --output-tokens 16 -o /tmp/cpu-tuned.yaml --json
    """
    from qlift.fsutil import check_output_path
    from qlift.perf import TuneInputs, run

    opts = TuneOptions(**options)
    check_output_path(out, force=force, inputs=[model])
    result = run(TuneInputs(model, out, plot), opts)
    emit(result, lambda: _print(result))


def _print(r: TuneResult) -> None:
    click.echo(f"{r.hardware}, vLLM {r.vllm_version or '?'}")
    for p in r.points:
        mark = "*" if p.label == r.chosen else " "
        if p.best is None:
            click.echo(f"{mark} {p.label:<48} {p.status}: {p.reason}")
        else:
            b = p.best
            server = p.server.tokens_per_s if p.server else None
            click.echo(f"{mark} {p.label:<48} goodput {b.goodput_requests_per_s:7.2f} req/s  "
                       f"{b.output_tokens_per_s:8.1f} tok/s  p99 e2e {b.latency_ms['e2el']['p99'] / 1000:6.2f} s  "
                       f"p99 gap {b.latency_ms['itl']['p99']:6.1f} ms  c={b.concurrency}"
                       f"{f'  server {server:.1f} tok/s (all levels)' if server else ''}"
                       f"{'' if p.slo_met else '  (SLO not met)'}{f'  ({p.reason})' if p.reason else ''}")
    click.echo(f"wrote {r.recipe_path} (chose {r.chosen}{'' if r.slo_met else '; no point met the SLO'}); "
               f"`qlift recipes show {r.recipe_path}` shows it")
    if r.plot:
        click.echo(f"plot: {r.plot}")
