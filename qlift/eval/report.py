"""Reports of an evaluation: report.json (every number), report.md, report.html (self-contained)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from qlift.eval.compare import MetricSummary
from qlift.eval.html import render_html, slices_to_show, whole_set_tags
from qlift.fsutil import atomic_output_dir
from qlift.lineage import utc_now, write_manifest


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def result_json(result: Any) -> dict[str, Any]:
    from qlift.serialize import to_jsonable

    return _clean(to_jsonable(result))  # type: ignore[no-any-return]


def fmt(x: float | None, metric: str = "") -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if metric in ("length",):
        return f"{x:.1f}"
    return f"{x:.4g}" if abs(x) >= 1 or x == 0 else f"{x:.4f}"


def fmt_diff(s: MetricSummary) -> str:
    if s.diff is None:
        return "-"
    ci = f" [{fmt(s.ci_low)}, {fmt(s.ci_high)}]" if s.ci_low is not None else ""
    sign = "+" if s.diff > 0 else ""
    return f"{sign}{fmt(s.diff)}{ci}"


def wtl(s: MetricSummary) -> str:
    return "-" if s.wins is None else f"{s.wins}/{s.ties}/{s.losses}"


def _table(rows: list[MetricSummary], has_base: bool) -> list[str]:
    if has_base:
        lines = [
            "| metric | n | candidate | baseline | diff [95% CI] | win/tie/loss |",
            "|---|---:|---:|---:|---|---:|",
        ]
        for s in rows:
            lines.append(
                f"| {s.metric} | {s.n} | {fmt(s.candidate, s.metric)} | {fmt(s.baseline, s.metric)} "
                f"| {fmt_diff(s)} | {wtl(s)} |"
            )
    else:
        lines = ["| metric | n | candidate |", "|---|---:|---:|"]
        lines += [f"| {s.metric} | {s.n} | {fmt(s.candidate, s.metric)} |" for s in rows]
    return lines


def share_text(j: dict[str, Any], what: str) -> str:
    share, ci = j.get(f"{what}_share"), j.get(f"{what}_ci95")
    if share is None:
        return "-"
    return f"{share:.0%}" + (f" (95% CI {ci[0]:.0%}-{ci[1]:.0%})" if ci else "")


def render_markdown(result: Any) -> str:
    has_base = result.baseline is not None
    verdict = "PASS" if result.passed else "FAIL"
    title = f"`{result.candidate.name}`" + (f" vs `{result.baseline.name}`" if has_base else "")
    out = [
        f"# qlift eval: {title}",
        "",
        f"**{verdict}** · {result.examples_count} examples from `{result.prompts}` · backend {result.backend} · "
        f"greedy, max_tokens {result.sampling.max_tokens} · paired bootstrap "
        f"{result.bootstrap['resamples']} resamples (seed {result.bootstrap['seed']})",
        "",
    ]
    if getattr(result, "answers", None):
        out += ["Answers: " + "; ".join(f"{role}: {path}" for role, path in result.answers.items()) + ".", ""]
    if getattr(result.candidate, "engine_args", None):
        args = ", ".join(f"`{k}={v}`" for k, v in result.candidate.engine_args.items())
        out += [f"The candidate ran with vLLM engine arguments {args}.", ""]
    if result.gates:
        out += ["## Gates", ""]
        out += [f"- {'PASS' if g.passed else 'FAIL'} `{g.expr}` ({g.detail})" for g in result.gates]
        out.append("")
    if getattr(result, "judge", None):
        j = result.judge
        out += ["## Judge", "",
                f"`{j['model']}` ({j['rubric']}), {j['judged']} prompts judged twice with the order swapped: "
                f"candidate better {share_text(j, 'wins')}, tie {share_text(j, 'ties')} ({j['swapped_disagreed']} "
                f"of them the two orders disagreeing), baseline better {share_text(j, 'losses')}; "
                f"{j['unjudged']} unjudged.", ""]
    if getattr(result, "baseline_reads", None):
        from qlift.eval.baseline_reads import describe

        out += ["## Baseline reads", "", describe(result.baseline_reads) + ".", ""]
    if getattr(result, "latency_warning", None):
        out += [f"> **Warning:** {result.latency_warning}", ""]
    out += ["## Overall", "", *_table([s for s in result.overall if s.n], has_base), ""]
    for tag, rows in slices_to_show(result).items():
        out += [f"## Slice `{tag}`", "", *_table([s for s in rows if s.n], has_base), ""]
    whole = whole_set_tags(result)
    if whole:
        out += [", ".join(f"`{t}`" for t in whole) + ": every example, so the same as Overall.", ""]
    notes = [n for n in result.notes if n != getattr(result, "latency_warning", None)]
    if notes:
        out += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    out.append("diff = candidate - baseline; win = the candidate is better on that example.")
    return "\n".join(out) + "\n"


def write_reports(result: Any, out: Path, *, force: bool, inputs: dict[str, Path]) -> None:
    started = utc_now()
    with atomic_output_dir(out, force=force, inputs=inputs.values()) as tmp:
        data = result_json(result)
        data["report_dir"] = str(out)
        (tmp / "report.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (tmp / "report.md").write_text(render_markdown(result), encoding="utf-8")
        (tmp / "report.html").write_text(render_html(result), encoding="utf-8")
        write_manifest(
            tmp, operation="eval", inputs=inputs, started_at=started,
            parameters={
                "backend": result.backend, "metrics": result.metrics, "gates": [g.expr for g in result.gates],
                "max_tokens": result.sampling.max_tokens, "passed": result.passed,
            },
        )
