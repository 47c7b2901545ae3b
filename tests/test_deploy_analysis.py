"""The Argo AnalysisTemplate judges as `qlift promote` does: one real Prometheus scrapes vLLM-shaped
series for a stable and four canaries (healthy, slow, cut at max_tokens, rambling); for each
canary, promote's Prometheus source + judge and the AnalysisTemplate's queries + Argo's success /
failure conditions must reach the same verdict on every check."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from qlift.deploy.argo import checks
from qlift.rollout.evidence import Evidence
from qlift.rollout.judge import run_checks
from qlift.rollout.prometheus import PrometheusSource
from qlift.rollout.spec import AnalysisSpec, PrometheusSpec
from qlift.vllm.process import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
WINDOW_S = 10
BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# per served model: requests/s, share cut at max_tokens, tokens per answer, e2e and TTFT bucket (upper bound)
PROFILES = {
    "base": {"rps": 5.0, "length": 0.02, "tokens": 100, "e2e": 0.5, "ttft": 0.1},
    "good": {"rps": 5.0, "length": 0.02, "tokens": 105, "e2e": 0.5, "ttft": 0.1},
    "slow": {"rps": 5.0, "length": 0.02, "tokens": 100, "e2e": 2.5, "ttft": 0.1},
    "cut": {"rps": 5.0, "length": 0.5, "tokens": 100, "e2e": 0.5, "ttft": 0.1},
    "rambling": {"rps": 5.0, "length": 0.02, "tokens": 300, "e2e": 0.5, "ttft": 0.1},
}
# AnalysisTemplate metric -> promote judge check
SAME_CHECK = {"latency-ratio": "latency", "ttft-ratio": "ttft", "finish-length-share-ratio": "finish_length",
              "completion-tokens-ratio": "completion_tokens"}


def _exposition(t: float) -> str:
    """vLLM's series as counters growing with ``t`` seconds: each model's requests all land in one bucket."""
    lines = ["# TYPE vllm:request_success_total counter", "# TYPE vllm:generation_tokens_total counter",
             "# TYPE vllm:e2e_request_latency_seconds histogram", "# TYPE vllm:time_to_first_token_seconds histogram"]
    for model, p in PROFILES.items():
        n = p["rps"] * t
        m = f'model_name="{model}"'
        lines.append(f'vllm:request_success_total{{{m},finished_reason="length"}} {n * p["length"]}')
        lines.append(f'vllm:request_success_total{{{m},finished_reason="stop"}} {n * (1 - p["length"])}')
        lines.append(f"vllm:generation_tokens_total{{{m}}} {n * p['tokens']}")
        for name, upper in (("e2e_request_latency_seconds", p["e2e"]), ("time_to_first_token_seconds", p["ttft"])):
            for le in (*BUCKETS, "+Inf"):
                count = n if le == "+Inf" or float(le) >= upper else 0.0
                lines.append(f'vllm:{name}_bucket{{{m},le="{le}"}} {count}')
            lines.append(f"vllm:{name}_count{{{m}}} {n}")
            lines.append(f"vllm:{name}_sum{{{m}}} {n * upper * 0.75}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not Path(PROMETHEUS).exists():
        pytest.skip("prometheus is not installed")
    start = time.monotonic()

    class Exporter(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = _exposition(time.monotonic() - start).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    exporter = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    tmp = tmp_path_factory.mktemp("prom")
    port = free_port()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "vllm", "static_configs": [
            {"targets": [f"127.0.0.1:{exporter.server_address[1]}"]}]}]}))
    with open(tmp / "prometheus.log", "wb") as log:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # ready, then a full window of samples
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"prometheus did not start: {(tmp / 'prometheus.log').read_text()[-500:]}")
            time.sleep(0.2)
        time.sleep(WINDOW_S + 2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        exporter.shutdown()


def argo_verdict(condition_success: str, condition_failure: str, result: list[float]) -> str:
    """Argo's reading of a measurement: success, else failure, else inconclusive (conditions in expr)."""

    def holds(expr: str) -> bool:
        py = re.sub(r"\bfalse\b", "False", expr.replace("&&", " and ").replace("||", " or "))
        return bool(eval(py, {"__builtins__": {}}, {"result": result, "len": len}))  # noqa: S307

    if holds(condition_success):
        return "pass"
    return "fail" if holds(condition_failure) else "inconclusive"


def query(url: str, promql: str) -> list[float]:
    body = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert body["status"] == "success", body
    return [float(s["value"][1]) for s in body["data"]["result"]]


@pytest.mark.parametrize(("canary", "failing"), [
    ("good", set()), ("slow", {"latency"}), ("cut", {"finish_length"}), ("rambling", {"completion_tokens"}),
])
def test_argo_analysis_reaches_promotes_verdicts(prometheus: str, canary: str, failing: set[str]) -> None:
    analysis = AnalysisSpec.model_validate({})
    spec = PrometheusSpec.model_validate({"url": prometheus, "preset": "vllm"})
    got = PrometheusSource(spec, ["base", canary], {"base": "base", canary: canary}, WINDOW_S).collect()
    judged = {c.name: c.status for c in
              run_checks(Evidence(got["base"], got[canary], 0.0, 0.0, "prometheus"), analysis)}
    assert {name for name, status in judged.items() if status == "fail"} == failing, judged
    assert all(judged[name] == "pass" for name in SAME_CHECK.values() if name not in failing), judged
    args = {"stable": "base", "canary": canary, "stable-model": "base", "canary-model": canary}
    for check in checks("vllm", analysis, WINDOW_S):
        promql = re.sub(r"\{\{args\.([\w-]+)\}\}", lambda m: args[m.group(1)], check.query)
        verdict = argo_verdict(check.success, check.failure, query(prometheus, promql))
        if check.name == "canary-requests":
            assert verdict == "pass" and got[canary].requests >= analysis.min_requests
        else:
            assert verdict == judged[SAME_CHECK[check.name]], (check.name, verdict, judged)


def test_promote_drives_the_rendered_route_with_the_rendered_spec(run_cli, prometheus: str, tmp_path: Path) -> None:
    """`qlift deploy k8s --canary` output, run by `qlift promote start -f` unchanged but for where the
    route goes (a file, GitOps-style, instead of a cluster) and this Prometheus: promoted, route at 100."""
    from test_deploy import _model, validate

    out = tmp_path / "k8s"
    r = run_cli("deploy", "k8s", _model(tmp_path, "base"), "--recipe", "chat-h100", "--canary",
                _model(tmp_path, "good"), "-o", out, "--prometheus-url", prometheus)
    assert r.exit_code == 0, r.output
    spec = yaml.safe_load((out / "promote-rollout.yaml").read_text())
    spec["gateway"].pop("kubeconfig")
    spec["gateway"]["output"] = str(out / "httproute.yaml")
    (tmp_path / "rollout.yaml").write_text(yaml.safe_dump(spec))
    started = time.monotonic()
    r = run_cli("promote", "start", "-f", tmp_path / "rollout.yaml", "--interval", "3s", "--min-requests", "5",
                "--journal", tmp_path / "journal.sqlite")
    assert r.exit_code == 0, r.output
    assert time.monotonic() - started < 60
    route = yaml.safe_load((out / "httproute.yaml").read_text())
    validate(route)
    assert [(b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]] == [
        ("llm-stable", 0), ("llm-canary", 100)]
