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

from qlift import httpclient
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
    "quiet": {"rps": 5.0, "length": 0.0, "tokens": 30, "e2e": 0.5, "ttft": 0.1},
    # a base that rambles to max_tokens, and a fine-tune that answers in short JSON by design
    "rambler": {"rps": 5.0, "length": 0.9, "tokens": 64, "e2e": 0.5, "ttft": 0.1},
    "terse": {"rps": 5.0, "length": 0.0, "tokens": 30, "e2e": 0.5, "ttft": 0.1},
}
# Behind nginx both versions serve the client's one model name: two scrape targets tell them apart.
NGINX_TARGETS = {"stable": PROFILES["base"], "canary": PROFILES["good"]}
EXPORTERS: dict[str, str] = {}  # role -> host:port of its exporter (the scrape's instance label)


def _exposition(t: float, profiles: dict[str, dict[str, float]] = PROFILES) -> str:
    """vLLM's series as counters growing with ``t`` seconds: each model's requests all land in one bucket."""
    lines = ["# TYPE vllm:request_success_total counter", "# TYPE vllm:generation_tokens_total counter",
             "# TYPE vllm:e2e_request_latency_seconds histogram", "# TYPE vllm:time_to_first_token_seconds histogram"]
    for model, p in profiles.items():
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

    def exporter_for(profiles: dict[str, dict[str, float]]) -> ThreadingHTTPServer:
        class Exporter(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = _exposition(time.monotonic() - start, profiles).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    exporter = exporter_for(PROFILES)
    behind_nginx = {role: exporter_for({"chat": p}) for role, p in NGINX_TARGETS.items()}
    EXPORTERS.update({role: f"127.0.0.1:{e.server_address[1]}" for role, e in behind_nginx.items()})
    tmp = tmp_path_factory.mktemp("prom")
    port = free_port()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "vllm", "static_configs": [
            {"targets": [f"127.0.0.1:{exporter.server_address[1]}", *EXPORTERS.values()]}]}]}))
    with open(tmp / "prometheus.log", "wb") as log:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # ready, then a full window of samples
            try:
                if httpclient.get(f"{url}/-/ready", timeout=1).status_code == 200:
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
        for e in behind_nginx.values():
            e.shutdown()


def argo_verdict(condition_success: str, condition_failure: str, result: list[float]) -> str:
    """Argo's reading of a measurement: success, else failure, else inconclusive (conditions in expr)."""

    def holds(expr: str) -> bool:
        py = re.sub(r"\bfalse\b", "False", expr.replace("&&", " and ").replace("||", " or "))
        return bool(eval(py, {"__builtins__": {}}, {"result": result, "len": len}))  # noqa: S307

    if holds(condition_success):
        return "pass"
    return "fail" if holds(condition_failure) else "inconclusive"


def query(url: str, promql: str) -> list[float]:
    body = httpclient.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert body["status"] == "success", body
    return [float(s["value"][1]) for s in body["data"]["result"]]


@pytest.mark.parametrize(("stable", "canary", "failing"), [
    ("base", "good", set()), ("base", "slow", {"latency"}), ("base", "cut", {"finish_length"}),
    ("base", "rambling", {"completion_tokens"}), ("base", "quiet", {"completion_tokens"}),
    # short answers against a stable cut at max_tokens in 90% of its answers: style, not silence
    ("rambler", "terse", set()),
])
def test_argo_analysis_reaches_promotes_verdicts(prometheus: str, stable: str, canary: str, failing: set[str]) -> None:
    analysis = AnalysisSpec.model_validate({})
    spec = PrometheusSpec.model_validate({"url": prometheus, "preset": "vllm"})
    got = PrometheusSource(spec, [stable, canary], {stable: stable, canary: canary}, WINDOW_S).collect()
    judged = {c.name: c.status for c in
              run_checks(Evidence(got[stable], got[canary], 0.0, 0.0, "prometheus"), analysis)}
    assert {name for name, status in judged.items() if status == "fail"} == failing, judged
    args = {"stable": stable, "canary": canary, "stable-model": stable, "canary-model": canary}
    metrics = checks("vllm", analysis, WINDOW_S)
    assert {m.check for m in metrics} == {n for n, status in judged.items() if status != "skipped"}
    for check in metrics:
        promql = re.sub(r"\{\{args\.([\w-]+)\}\}", lambda m: args[m.group(1)], check.query)
        verdict = argo_verdict(check.success, check.failure, query(prometheus, promql))
        assert verdict == judged[check.check], (check.name, verdict, judged)
    assert got[canary].requests >= analysis.min_requests


def test_nginx_plane_reads_prometheus_by_scrape_target(prometheus: str, tmp_path: Path) -> None:
    """Behind nginx both versions serve one model name: the nginx plane's default preset tells them apart
    by scrape target, where the router preset (the old default) saw 0 requests and said nothing."""
    from qlift.rollout.sources import make_collector
    from qlift.rollout.spec import build_spec

    backends = {"stable": f"http://{EXPORTERS['stable']}", "canary": f"http://{EXPORTERS['canary']}"}
    base = {"stable": "stable", "canary": "canary", "data_plane": "nginx", "provider": "prometheus",
            "interval": WINDOW_S, "vllm_metrics": False, "backends": backends,
            "nginx": {"prefix": str(tmp_path / "nginx")}}
    spec = build_spec({**base, "prometheus": {"url": prometheus}}, {})
    assert spec.prometheus is not None and spec.prometheus.preset == "nginx"
    collector = make_collector(spec, {}, router_token=None)
    collector.begin()
    ev = collector.collect()
    assert ev.canary.requests >= 20 and ev.stable.requests >= 20, ev
    assert not ev.notes, ev.notes
    assert {c.name for c in run_checks(ev, spec.analysis) if c.status == "fail"} == set()

    routed = build_spec({**base, "prometheus": {"url": prometheus, "preset": "router"}}, {})
    collector = make_collector(routed, {}, router_token=None)
    collector.begin()
    ev = collector.collect()
    assert ev.canary.requests == 0
    assert any("no series at all for canary" in n for n in ev.notes), ev.notes


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
