"""qlift eval."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from qlift.cli.output import emit, json_option
from qlift.cli.params import URL, count


@click.command("eval")
@click.argument("candidate")
@click.option("--baseline", help="Model to compare with (a directory; a served name with --backend endpoint).")
@click.option("--prompts", "prompts", required=True, type=click.Path(path_type=Path),
              help="Prompt set, JSONL (see docs/eval.md).")
@click.option("--backend", type=click.Choice(["vllm", "endpoint", "transformers"]),
              help="How to generate. Default: endpoint if --endpoint is given, else vllm (transformers without vLLM).")
@click.option("--endpoint", type=URL, help="Base URL of an OpenAI-compatible server serving the candidate.")
@click.option("--model", "model_name", help="Served name of the candidate at --endpoint (default: CANDIDATE).")
@click.option("--baseline-endpoint", type=URL, help="Server of the baseline, if not --endpoint.")
@click.option("--metrics", help="Comma-separated subset: ppl,exact_match,rougeL,chrF,json_valid,schema_pass,"
              "check_pass,length,latency (default: all that apply).")
@click.option("--gate", "gates", multiple=True, metavar="EXPR",
              help="Release gate, repeatable, e.g. 'rougeL >= baseline - 0.02'. Any failure exits 10.")
@click.option("--report", "report_dir", type=click.Path(path_type=Path),
              help="Write report.json, report.md and report.html into this new directory.")
@click.option("--force", is_flag=True, help="Replace an existing --report directory.")
@click.option("--max-tokens", type=count(1, 1 << 20), default=64, show_default=True,
              help="Greedy output tokens per prompt.")
@click.option("--bootstrap", "resamples", type=count(100, 100_000), default=1000, show_default=True,
              help="Paired bootstrap resamples.")
@click.option("--seed", type=count(0, 2**63 - 1), default=0, show_default=True,
              help="Seed of the bootstrap (and of sampling).")
@click.option("--no-cache", is_flag=True, help="Generate again instead of reading cached generations.")
@click.option("--concurrency", type=count(1, 1024), default=1, show_default=True,
              help="Parallel requests (endpoint backend).")
@click.option("--max-model-len", type=count(16, 1 << 24), default=4096, show_default=True,
              help="vLLM context length (vllm backend).")
@click.option("--api-key", envvar="QLIFT_EVAL_API_KEY", help="Bearer token for the endpoint (env QLIFT_EVAL_API_KEY).")
@json_option
def eval_cmd(**kw: Any) -> None:
    """Evaluate CANDIDATE against --baseline on held-out prompts, with gates.

    Both models answer every prompt greedily; each metric is reported overall and per
    tag, with the candidate-baseline difference, its paired bootstrap 95% confidence
    interval and win/tie/loss counts. Generations are cached by model content, so a
    rerun with other gates or reports does not generate again.

    Exit codes: 0 all gates pass, 10 a gate failed, 8 the backend failed, 2 bad input.

    \b
    Examples:
      qlift eval ./merged --baseline ./base --prompts examples/prompts/smoke.jsonl \\
          --gate "rougeL >= baseline - 0.02" --gate "ppl <= baseline * 1.05" --report out/eval
      qlift eval smollm2 --backend endpoint --endpoint http://127.0.0.1:8000 \\
          --prompts examples/prompts/smoke.jsonl --gate "json_valid >= 0.98" --json
    """
    from qlift.eval import EvalOptions, evaluate, require_pass

    candidate, no_cache = kw.pop("candidate"), kw.pop("no_cache")
    r = evaluate(candidate, EvalOptions(**kw, use_cache=not no_cache))

    def human() -> None:
        from qlift.eval.report import fmt, fmt_diff, wtl

        title = r.candidate.name + (f" vs {r.baseline.name}" if r.baseline else "")
        click.echo(f"{title}: {r.examples_count} examples, backend {r.backend}")
        for s in r.overall:
            line = f"  {s.metric:<12} {fmt(s.candidate, s.metric):>9}"
            if r.baseline is not None:
                line += f"  baseline {fmt(s.baseline, s.metric):>9}  diff {fmt_diff(s)}  w/t/l {wtl(s)}"
            click.echo(line)
        for g in r.gates:
            click.echo(f"  {'PASS' if g.passed else 'FAIL'}  {g.expr}  ({g.detail})")
        for n in r.notes:
            click.echo(f"note: {n}", err=True)
        if r.report_dir:
            click.echo(f"report: {r.report_dir}/report.html")
        cached = f"{r.cache.hits} cached, {r.cache.misses} generated"
        click.echo(f"done in {r.seconds:.1f} s ({cached})", err=True)

    emit(r, human)
    require_pass(r)
