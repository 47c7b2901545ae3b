"""The HTML eval report's structure: direction markers, units, regression highlights, labels clear
of the whiskers. Rendered from summaries directly (no model needed)."""

from __future__ import annotations

from html.parser import HTMLParser
from types import SimpleNamespace as NS
from typing import Any

import pytest

from qlift.eval.compare import MetricSummary as M
from qlift.eval.html import UNITS, ci_verdict, render_html
from qlift.eval.metrics import METRICS

CHAR_PX = 7.0  # generous width of one 11px sans-serif character

OVERALL = [
    M("ppl", 40, 12.3, 11.9, 0.4, -0.2, 1.1, 15, 3, 22, False),  # CI contains 0: nothing flagged
    M("rougeL", 40, 0.41, 0.52, -0.11, -0.19, -0.04, 8, 10, 22, True),  # worse, CI excludes 0
    M("chrF", 40, 48.0, 45.2, 2.8, 0.9, 4.7, 25, 5, 10, True),  # better, CI excludes 0
    M("json_valid", 20, 0.95, 0.9, 0.05, -0.05, 0.15, 3, 16, 1, True),
    M("length", 40, 52.0, 48.0, 4.0, 1.0, 11.0, None, None, None, None),  # longer is neither
    M("latency", 40, 1.84, 1.21, 0.63, 0.41, 0.88, 5, 0, 35, False),  # slower, CI excludes 0
    M("exact_match", 40, 0.1, 0.9, -0.8, -0.95, -0.6, 0, 4, 36, True),  # CI far wider than the bar
]
EXPECTED = {"rougeL": "regression", "latency": "regression", "exact_match": "regression", "chrF": "improvement"}


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[dict[str, Any]] = []
        self.charts: dict[str, dict[str, Any]] = {}
        self.rows: dict[str, dict[str, Any]] = {}
        self._chart: str | None = None
        self._row: str | None = None
        self._text: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        cls = a.get("class", "").split()
        if tag == "div" and "chart" in cls:
            self._chart = a["data-metric"]
            self.charts[self._chart] = {"cls": cls, "directions": [], "flags": [], "values": [], "ci_x": [],
                                        "title": "", "bar_ends": []}
        elif tag == "tr" and "summary" in cls and a.get("data-metric"):
            self._row = a["data-metric"]
            self.rows[self._row] = {"cls": cls, "directions": [], "flags": []}
        target = self.charts.get(self._chart or "") if self._chart else self.rows.get(self._row or "")
        if target is None:
            return
        if tag == "span" and "direction" in cls:
            target["directions"].append(a["data-direction"])
        if tag == "span" and "flag" in cls:
            target["flags"].append(cls[1])
        if tag == "svg":
            target["unit"] = a["data-unit"]
        if tag == "rect" and "bar" in cls:
            target["bar_ends"].append(float(a["x"]) + float(a["width"]))
        if tag == "line" and "ci" in cls:
            target["ci_x"] += [float(a["x1"]), float(a["x2"])]
        if tag == "text" and "value" in cls:
            self._text = {"x": float(a["x"]), "anchor": a.get("text-anchor"), "text": ""}
            target["values"].append(self._text)

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text["text"] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "text":
            self._text = None
        if tag == "div" and self._chart:
            self._chart = None
        if tag == "tr":
            self._row = None


def _result(overall: list[M], **kw: Any) -> NS:
    ex = NS(id="a", prompt="p", reference="r", tags=[], outputs={"candidate": "x", "baseline": "y"}, scores={})
    fields = dict(candidate=NS(name="cand"), baseline=NS(name="base"), passed=True, gates=[], overall=overall,
                  slices={}, notes=[], examples=[ex], examples_count=40, prompts="p.jsonl", backend="vllm",
                  sampling=NS(max_tokens=8), bootstrap={"resamples": 100, "seed": 0})
    return NS(**(fields | kw))


def _render(overall: list[M], **kw: Any) -> _Parser:
    p = _Parser()
    p.feed(render_html(_result(overall, **kw)))
    return p


@pytest.fixture(scope="module")
def report() -> _Parser:
    return _render(OVERALL)


def test_every_metric_says_which_direction_is_better(report) -> None:
    for s in OVERALL:
        want = {True: ["higher"], False: ["lower"], None: []}[METRICS[s.metric].higher_is_better]
        assert report.charts[s.metric]["directions"] == want, s.metric
        assert report.rows[s.metric]["directions"] == want, s.metric


def test_regressions_whose_ci_excludes_zero_are_highlighted(report) -> None:
    for s in OVERALL:
        want = EXPECTED.get(s.metric)
        assert ci_verdict(s) == (want or "")
        for where in (report.charts[s.metric], report.rows[s.metric]):
            assert where["flags"] == ([want] if want else []), s.metric
            assert (want in where["cls"]) if want else not {"regression", "improvement"} & set(where["cls"])


def test_latency_and_length_carry_their_unit(report) -> None:
    assert UNITS == {"latency": "s", "length": "tokens"}
    for metric, unit in UNITS.items():
        chart = report.charts[metric]
        assert chart["unit"] == unit
        assert [v["text"] for v in chart["values"]] == [f"1.84 {unit}", f"1.21 {unit}"] if metric == "latency" \
            else [f"52 {unit}", f"48 {unit}"]
    assert report.charts["rougeL"]["unit"] == ""


@pytest.mark.parametrize("ci", [(-0.19, -0.04), (-0.95, 5.0), (-100.0, 100.0), (0.0, 0.0)])
def test_value_labels_never_overlap_the_whiskers(ci) -> None:
    s = M("rougeL", 40, 0.41, 0.52, -0.11, ci[0], ci[1], 1, 1, 1, True)
    chart = _render([s]).charts["rougeL"]
    assert chart["ci_x"] and len(chart["values"]) == 2
    for v in chart["values"]:
        assert v["anchor"] == "end"
        left_edge = v["x"] - CHAR_PX * len(v["text"])
        assert max(chart["ci_x"]) < left_edge, (chart["ci_x"], v)


@pytest.mark.parametrize("values", [(60.88, 58.1), (60.88, 60.88), (1234.5, 0.5), (0.0001234, 0.0)])
def test_value_labels_never_overlap_the_bars(values) -> None:
    """The "60.88 tokens" case: a long label must end left of nothing, start right of every bar's end."""
    s = M("length", 40, values[0], values[1], values[0] - values[1], -1.0, 1.0, None, None, None, None)
    chart = _render([s]).charts["length"]
    assert len(chart["bar_ends"]) == 2 and len(chart["values"]) == 2
    for v in chart["values"]:
        left_edge = v["x"] - CHAR_PX * len(v["text"])
        assert max(chart["bar_ends"] + chart["ci_x"]) < left_edge, (chart, v)


def test_slices_under_ten_examples_are_not_called_significant() -> None:
    few = M("rougeL", 6, 0.41, 0.62, -0.21, -0.3, -0.1, 0, 1, 5, True)  # CI excludes 0, but 6 examples
    assert ci_verdict(few) == ""
    assert ci_verdict(M("rougeL", 10, 0.41, 0.62, -0.21, -0.3, -0.1, 0, 1, 9, True)) == "regression"
    html = render_html(_result([few]))
    p = _Parser()
    p.feed(html)
    assert p.rows["rougeL"]["flags"] == [] and "regression" not in p.rows["rougeL"]["cls"]
    assert "n &lt; 10: not called" in html


def test_a_slice_holding_every_example_is_not_a_second_overall_table() -> None:
    from qlift.eval.report import render_markdown

    rows = [M("rougeL", 40, 0.5, 0.4, 0.1, 0.05, 0.15, 20, 10, 10, True)]
    examples = [NS(id=f"e{i}", prompt="p", reference="r", tags=["json"] + (["refund"] if i < 12 else []),
                   outputs={"candidate": "x", "baseline": "y"}, scores={}) for i in range(40)]
    result = _result(rows, slices={"json": rows, "refund": rows}, examples=examples)
    html = render_html(result)
    assert html.count('<table class="summary"') == 2  # overall and refund
    assert 'data-slice="refund"' in html and 'data-slice="json"' not in html
    assert "<code>json</code>: every example, so the same as Overall." in html
    md = render_markdown(result)
    assert "## Slice `refund`" in md and "## Slice `json`" not in md and "`json`: every example" in md


def test_latency_from_unequally_loaded_servers_gets_a_warning_not_a_verdict() -> None:
    from qlift.eval.generation import EvalModel
    from qlift.eval.run import latency_warning

    cand = EvalModel("candidate", "canary", endpoint="http://127.0.0.1:8001")
    assert latency_warning(cand, EvalModel("baseline", "stable", endpoint="http://127.0.0.1:8002"), {})
    assert latency_warning(cand, EvalModel("baseline", "canary", endpoint="http://127.0.0.1:8001"), {}) is None
    local = EvalModel("candidate", "a"), EvalModel("baseline", "b")
    assert "load average 3.2 for the candidate, 0.4" in (latency_warning(*local, {"candidate": 3.2, "baseline": 0.4})
                                                         or "")
    assert latency_warning(*local, {"candidate": 1.2, "baseline": 0.9}) is None

    warn = latency_warning(cand, EvalModel("baseline", "stable", endpoint="http://127.0.0.1:8002"), {})
    slow = M("latency", 40, 1.84, 1.21, 0.63, 0.41, 0.88, 5, 0, 35, False)
    html = render_html(_result([slow], latency_warning=warn, notes=[warn]))
    p = _Parser()
    p.feed(html)
    assert 'class="warning latency-warning"' in html and html.count("whose cores may be unequally loaded") == 1 + 2
    assert p.charts["latency"]["flags"] == ["unequal"] and "regression" not in p.charts["latency"]["cls"]
    assert p.rows["latency"]["flags"] == ["unequal"]
