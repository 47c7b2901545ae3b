"""The self-contained HTML report: inline CSS and SVG, every model output escaped."""

from __future__ import annotations

import math
from html import escape
from typing import Any

from qlift.eval.compare import MetricSummary

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.4em}.pass{color:#137333}.fail{color:#b3261e}
table{border-collapse:collapse;width:100%;margin:.5em 0 1.5em}
th,td{border:1px solid #ddd;padding:4px 6px;vertical-align:top;text-align:left}
th{background:#f5f5f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font:12px/1.35 ui-monospace,monospace}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{border:2px solid #e5e5e5;padding:6px 8px;border-radius:6px}
.chart h3{margin:0 0 4px;font-size:13px}.bar.candidate{fill:#3b6fd8}.bar.baseline{fill:#a9a9a9}
.ci{stroke:#111;stroke-width:1.5}svg text{font:11px system-ui,sans-serif;fill:#333}
.direction{font-weight:normal;color:#666;font-size:12px}
.chart.regression{border:2px solid #b3261e;background:#fdf0ef}.chart.improvement{border:2px solid #137333}
tr.regression td{background:#fdf0ef}tr.regression td:first-child{border-left:3px solid #b3261e}
tr.improvement td:first-child{border-left:3px solid #137333}.flag{font-size:11px;font-weight:bold}
.flag.regression{color:#b3261e}.flag.improvement{color:#137333}
.warning{border:2px solid #b06000;background:#fef7e0;padding:6px 10px;border-radius:6px}
.flag.unequal{color:#b06000}.few{color:#666;font-size:11px}
"""
# Chart geometry: role labels | bars and whiskers | value labels in a column of their own,
# so a value label never sits on a whisker however wide the CI is.
_W, _LABEL, _BAR_H = 320, 70, 16
_CHAR_W = 6.6  # px per character of an 11px system-ui label, rounded up (digits are ~6.1)
UNITS = {"latency": "s", "length": "tokens"}  # the rest are scores or ratios without a unit
# Fewer paired examples than this and a 95% CI is too rough to call a regression or an improvement.
MIN_SIGNIFICANT_N = 10


def metric_title(metric: str) -> str:
    unit = UNITS.get(metric)
    return f"{metric} ({unit})" if unit else metric


def direction(s: MetricSummary) -> str:
    """'higher', 'lower' or '' (a metric where neither is better, such as output length)."""
    if s.higher_is_better is None:
        return ""
    return "higher" if s.higher_is_better else "lower"


def ci_verdict(s: MetricSummary) -> str:
    """'regression' or 'improvement' when the diff's 95% CI excludes 0 in a direction that matters."""
    if s.higher_is_better is None or s.ci_low is None or s.ci_high is None or s.ci_contains_zero:
        return ""
    if s.n < MIN_SIGNIFICANT_N:
        return ""
    better = s.ci_low > 0 if s.higher_is_better else s.ci_high < 0
    return "improvement" if better else "regression"


def _direction_marker(s: MetricSummary) -> str:
    d = direction(s)
    if not d:
        return ""
    arrow = "&#8593;" if d == "higher" else "&#8595;"
    return f' <span class="direction" data-direction="{d}">{arrow} {d} is better</span>'


def _flag(s: MetricSummary, latency_warning: str | None = None) -> str:
    if s.metric == "latency" and latency_warning:
        return f' <span class="flag unequal" title="{escape(latency_warning)}">&#9888; unequal load</span>'
    v = ci_verdict(s)
    if v:
        return f' <span class="flag {v}">{v}</span>'
    few = (s.higher_is_better is not None and s.ci_low is not None and not s.ci_contains_zero
           and s.n < MIN_SIGNIFICANT_N)
    return f' <span class="few">n &lt; {MIN_SIGNIFICANT_N}: not called</span>' if few else ""


def verdict_of(s: MetricSummary, latency_warning: str | None) -> str:
    """ci_verdict, except for a latency timed under unequal load, which gets no verdict."""
    return "" if s.metric == "latency" and latency_warning else ci_verdict(s)


def slices_to_show(result: Any) -> dict[str, list[MetricSummary]]:
    """The slices worth a table: not one that holds every example (it would repeat Overall)."""
    return {tag: rows for tag, rows in result.slices.items()
            if sum(tag in ex.tags for ex in result.examples) < result.examples_count}


def whole_set_tags(result: Any) -> list[str]:
    return [tag for tag in result.slices if tag not in slices_to_show(result)]


def _f(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.4g}" if abs(x) >= 1 or x == 0 else f"{x:.4f}"


def metric_chart(s: MetricSummary, has_base: bool) -> str:
    """Bars for candidate and baseline; the whisker is baseline + the diff's 95% CI."""
    vals = [v for v in (s.candidate, s.baseline) if v is not None and math.isfinite(v)]
    ci = None
    if has_base and s.baseline is not None and s.ci_low is not None and s.ci_high is not None:
        ci = (s.baseline + s.ci_low, s.baseline + s.ci_high)
        vals += [v for v in ci if math.isfinite(v)]
    top = max(vals + [1e-12])
    unit = UNITS.get(s.metric, "")
    rows = [("candidate", s.candidate)] + ([("baseline", s.baseline)] if has_base else [])
    labels = {role: _f(v) + (f" {unit}" if unit and v is not None and math.isfinite(v) else "") for role, v in rows}
    # The value column is as wide as its longest label, so no label reaches into a bar or whisker.
    plot_end = _W - 2 - math.ceil(max(len(t) for t in labels.values()) * _CHAR_W) - 8
    scale = (plot_end - _LABEL) / top

    def x(v: float) -> float:
        return _LABEL + min(max(0.0, v), top) * scale

    h = 10 + len(rows) * (_BAR_H + 8)
    parts = [
        f'<svg class="metric-chart" data-metric="{escape(s.metric)}" data-unit="{unit}" width="{_W}" height="{h}" '
        f'role="img" aria-label="{escape(metric_title(s.metric))}">'
    ]
    for i, (role, v) in enumerate(rows):
        y = 6 + i * (_BAR_H + 8)
        width = (x(v) - _LABEL) if v is not None and math.isfinite(v) else 0.0
        shown = labels[role]
        parts.append(f'<text x="0" y="{y + 12}">{role}</text>')
        parts.append(
            f'<rect class="bar {role}" data-value="{_f(v)}" x="{_LABEL}" y="{y}" '
            f'width="{width:.1f}" height="{_BAR_H}"><title>{role}: {shown}</title></rect>'
        )
        parts.append(f'<text class="value" data-plot-end="{plot_end:.1f}" x="{_W - 2}" y="{y + 12}" '
                     f'text-anchor="end">{shown}</text>')
        if role == "candidate" and ci is not None:
            cy = y + _BAR_H / 2
            x1, x2 = x(ci[0]), x(ci[1])
            parts.append(
                f'<line class="ci" data-low="{_f(s.ci_low)}" data-high="{_f(s.ci_high)}" '
                f'x1="{x1:.1f}" x2="{x2:.1f}" y1="{cy}" y2="{cy}"><title>95% CI of the diff: '
                f'[{_f(s.ci_low)}, {_f(s.ci_high)}]</title></line>'
            )
            for xx in (x1, x2):
                parts.append(f'<line class="ci" x1="{xx:.1f}" x2="{xx:.1f}" y1="{cy - 4}" y2="{cy + 4}"/>')
    parts.append("</svg>")
    return "".join(parts)


def _summary_table(rows: list[MetricSummary], has_base: bool, slice_name: str, latency_warning: str | None = None
                   ) -> str:
    head = "<tr><th>metric</th><th>n</th><th>candidate</th>"
    head += "<th>baseline</th><th>diff</th><th>95% CI</th><th>win/tie/loss</th></tr>" if has_base else "</tr>"
    body = []
    for s in rows:
        cells = (f"<td>{escape(metric_title(s.metric))}{_direction_marker(s)}{_flag(s, latency_warning)}</td>"
                 f"<td class=num>{s.n}</td><td class=num>{_f(s.candidate)}</td>")
        if has_base:
            ci = f"[{_f(s.ci_low)}, {_f(s.ci_high)}]" if s.ci_low is not None else "-"
            w = "-" if s.wins is None else f"{s.wins}/{s.ties}/{s.losses}"
            cells += (
                f"<td class=num>{_f(s.baseline)}</td><td class=num>{_f(s.diff)}</td>"
                f"<td class=num>{ci}</td><td class=num>{w}</td>"
            )
        cls = f"summary {verdict_of(s, latency_warning)}".rstrip()
        body.append(f'<tr class="{cls}" data-metric="{escape(s.metric)}">{cells}</tr>')
    return f'<table class="summary" data-slice="{escape(slice_name)}">{head}{"".join(body)}</table>'


def _examples(result: Any, has_base: bool) -> str:
    head = "<tr><th>id</th><th>prompt</th><th>reference</th>"
    head += "<th>baseline output</th>" if has_base else ""
    head += "<th>candidate output</th><th>scores (candidate / baseline)</th></tr>"
    rows = []
    for ex in result.examples:
        scores = "<br>".join(
            escape(f"{m}: {_f(v.get('candidate'))}" + (f" / {_f(v.get('baseline'))}" if has_base else ""))
            for m, v in ex.scores.items() if v.get("candidate") is not None
        )
        tags = f"<br><small>{escape(', '.join(ex.tags))}</small>" if ex.tags else ""
        cells = [
            f"<td>{escape(ex.id)}{tags}</td>",
            f"<td><pre>{escape(ex.prompt)}</pre></td>",
            f"<td><pre>{escape(ex.reference or '')}</pre></td>",
        ]
        if has_base:
            cells.append(f'<td class="output baseline"><pre>{escape(ex.outputs.get("baseline", ""))}</pre></td>')
        cells.append(f'<td class="output candidate"><pre>{escape(ex.outputs["candidate"])}</pre></td>')
        cells.append(f"<td><small>{scores}</small></td>")
        rows.append(f'<tr class="example" data-id="{escape(ex.id)}">{"".join(cells)}</tr>')
    return f'<table class="examples">{head}{"".join(rows)}</table>'


def render_html(result: Any) -> str:
    has_base = result.baseline is not None
    verdict = '<span class="pass">PASS</span>' if result.passed else '<span class="fail">FAIL</span>'
    title = escape(result.candidate.name) + (f" vs {escape(result.baseline.name)}" if has_base else "")
    gates = "".join(
        f'<li class="gate {"pass" if g.passed else "fail"}">{"PASS" if g.passed else "FAIL"} '
        f"<code>{escape(g.expr)}</code> ({escape(g.detail)})</li>"
        for g in result.gates
    )
    warn = getattr(result, "latency_warning", None)
    charts = "".join(
        f'<div class="{f"chart {verdict_of(s, warn)}".rstrip()}" data-metric="{escape(s.metric)}">'
        f"<h3>{escape(metric_title(s.metric))}{_direction_marker(s)}{_flag(s, warn)}</h3>"
        f"{metric_chart(s, has_base)}</div>"
        for s in result.overall if s.candidate is not None
    )
    slices = "".join(
        f"<h3>slice <code>{escape(tag)}</code></h3>{_summary_table([s for s in rows if s.n], has_base, tag, warn)}"
        for tag, rows in slices_to_show(result).items()
    )
    whole = whole_set_tags(result)
    if whole:
        tags = ", ".join(f"<code>{escape(t)}</code>" for t in whole)
        slices += f'<p class="whole-set">{tags}: every example, so the same as Overall.</p>'
    warning = f'<p class="warning latency-warning">&#9888; {escape(warn)}</p>' if warn else ""
    notes = "".join(f"<li>{escape(n)}</li>" for n in result.notes if n != warn)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>qlift eval: {title}</title><style>{_CSS}</style></head><body>"
        f"<h1>qlift eval: {title} {verdict}</h1>"
        f"<p>{result.examples_count} examples from <code>{escape(result.prompts)}</code>, backend "
        f"{escape(result.backend)}, greedy, max_tokens {result.sampling.max_tokens}. Bars: aggregate per model; "
        "whisker: baseline + paired-bootstrap 95% CI of (candidate - baseline). Arrows say which direction "
        "is better; a metric whose CI excludes 0 on the worse side is marked <span class=\"flag regression\">"
        "regression</span>, on the better side <span class=\"flag improvement\">improvement</span>; "
        f"not with fewer than {MIN_SIGNIFICANT_N} examples.</p>"
        + _answers(result)
        + warning
        + (f"<h2>Gates</h2><ul class=gates>{gates}</ul>" if gates else "")
        + f'<h2>Metrics</h2><div class="charts">{charts}</div>'
        + f"<h2>Overall</h2>{_summary_table([s for s in result.overall if s.n], has_base, 'overall', warn)}"
        + (f"<h2>Slices</h2>{slices}" if slices else "")
        + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
        + f"<h2>Examples</h2>{_examples(result, has_base)}</body></html>\n"
    )


def _answers(result: Any) -> str:
    """Which path produced each model's answers (the vLLM W4A16 kernel, weights unpacked from it, transformers)."""
    answers = getattr(result, "answers", None) or {}
    items = "; ".join(f"{escape(role)}: {escape(path)}" for role, path in answers.items())
    return f'<p class="answers">Answers: {items}.</p>' if items else ""
