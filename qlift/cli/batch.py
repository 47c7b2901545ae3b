"""qlift batch."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from qlift.cli.options import click_options
from qlift.cli.output import emit, json_option
from qlift.perf.options import BatchOptions

if TYPE_CHECKING:
    from qlift.perf.batch import BatchResult


@click.command("batch")
@click.argument("model", type=click.Path(path_type=Path))
@click.argument("input_path", metavar="IN.jsonl", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="Output JSONL (errors go to OUT.errors.jsonl beside it).")
@click_options(BatchOptions)
@json_option
def batch_cmd(model: Path, input_path: Path, out: Path, **options: Any) -> None:
    """Offline inference: every row of IN.jsonl through MODEL with one vLLM engine.

    Rows are the OpenAI batch format ({"custom_id", "body": {"messages"|"prompt", ...}}) or
    plain ({"id", "messages"|"prompt", ...}); a row may set max_tokens, temperature, top_p,
    stop and seed. Chat rows use the model's chat template. Output keeps the input's format
    (OpenAI batch output, or plain rows), in input order, with token counts and finish_reason.
    Finished rows are written as they finish, so a killed run keeps them and --resume runs
    only the rest. Malformed rows go to OUT.errors.jsonl with line numbers; the rest run.
    OUT.qlift-batch.json beside OUT records each id's request hash: --resume touches only an
    OUT that has one.

    \b
    Examples:
      qlift batch ./smollm2 prompts.jsonl -o answers.jsonl --max-tokens 128
      qlift batch ./merged requests.jsonl -o results.jsonl --recipe chat-h100 --resume
      qlift batch ./merged requests.jsonl -o results.jsonl --ray ray://10.0.0.5:10001 --json
    """
    from qlift.perf import BatchInputs, run

    result = run(BatchInputs(model, input_path, out), BatchOptions(**options))
    emit(result, lambda: _print(result))


def _print(r: BatchResult) -> None:
    rows: list[tuple[str, Any]] = [
        ("output", f"{r.output} ({r.output_rows} rows, in input order)"),
        ("this run", f"{r.rows_written} rows, {r.completion_tokens:,} output tokens in {r.generate_s:.1f} s "
                     + (f"on Ray at {r.ray_address} (engine start included)" if r.ray_address
                        else f"(+{r.load_s:.1f} s engine start)")),
        ("speed", f"{r.rows_per_s:.2f} rows/s, {r.output_tokens_per_s:.1f} output tok/s"),
    ]
    if r.rows_done_before or r.rows_changed or r.rows_dropped:
        rows.append(("resumed", f"{r.rows_done_before} rows kept, {r.rows_changed} changed since (run again), "
                                f"{r.rows_dropped} no longer in the input (dropped)"))
    if r.errors_file:
        rows.append(("errors", f"{r.rows_failed} rows in {r.errors_file}"))
    rows.append(("recipe", f"{r.recipe}, vLLM {r.vllm_version or '-'}, {r.engines} engine(s)"))
    rows += [("note", note) for note in r.notes]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k.ljust(width)}  {v}")
