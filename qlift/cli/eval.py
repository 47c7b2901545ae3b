"""qlift eval."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from qlift.cli.options import click_options
from qlift.cli.output import emit, json_option
from qlift.eval.options import EvalOptions


@click.command("eval")
@click.argument("candidate")
@click_options(EvalOptions)
@json_option
def eval_cmd(candidate: str, **options: Any) -> None:
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
    from qlift.eval import EvalInputs, require_pass, run
    from qlift.models.ref import ModelRef

    r = run(EvalInputs(ModelRef.at(Path(candidate)), named=candidate), EvalOptions(**options))

    def human() -> None:
        from qlift.eval.report import fmt, fmt_diff, wtl

        title = r.candidate.name + (f" vs {r.baseline.name}" if r.baseline else "")
        click.echo(f"{title}: {r.examples_count} examples, backend {r.backend}")
        for s in r.overall:
            line = f"  {s.metric:<12} {fmt(s.candidate, s.metric):>9}"
            if r.baseline is not None:
                line += f"  baseline {fmt(s.baseline, s.metric):>9}  diff {fmt_diff(s)}  w/t/l {wtl(s)}"
            click.echo(line)
        if r.judge:
            from qlift.eval.report import share_text

            j = r.judge
            click.echo(f"  judge {j['model']}: candidate better {share_text(j, 'wins')}, tie {share_text(j, 'ties')}, "
                       f"baseline better {share_text(j, 'losses')} over {j['judged']} prompts")
        if r.baseline_reads:
            from qlift.eval.baseline_reads import describe

            click.echo(f"  {describe(r.baseline_reads)}")
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
