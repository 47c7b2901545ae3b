"""The controller against the real `qlift router` process (small real HTTP backends, no model):
the router SIGKILLed and restarted mid-rollout, an abort while it is down, version names it does
not have, a promoted journal, and `status` telling whether a controller is alive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from faults import BackgroundLoad, RouterProcess
from test_promote import TOKEN, backends, promote_args  # noqa: F401  (backends: a fixture)

from qlift.rollout.journal import Journal
from qlift.router.client import RouterClient
from qlift.vllm.process import free_port


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)


def router_on(tmp_path: Path, port: int, stable_url: str, canary_url: str) -> RouterProcess:
    """The router as configured (stable 100%), on a fixed port so it can come back where it was."""
    return RouterProcess("--backend", f"stable={stable_url}@m-stable", "--backend", f"canary={canary_url}@m-canary",
                         "--weight", "stable=100", "--weight", "canary=0", "--public-model", "pub", "--port",
                         str(port), log_path=tmp_path / "router.log", token=TOKEN).start()


def wait_for(pred: Any, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except Exception:  # noqa: BLE001  (the router may be down meanwhile)
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def controller_proc(router_url: str, journal: Path, *extra: str, interval: str = "3s") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "qlift", *promote_args(router_url, journal, *extra,
                                                                           interval=interval)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_all(proc: subprocess.Popen[str] | None, router: RouterProcess) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(10)
    router.stop()


def test_router_killed_mid_rollout_gets_its_weights_back_and_the_canary_is_promoted(  # type: ignore[no-untyped-def]
        run_cli, tmp_path: Path, backends) -> None:  # noqa: F811
    a, b = backends
    port = free_port()
    router = router_on(tmp_path, port, a.url, b.url)
    journal = tmp_path / "j.sqlite"
    client = RouterClient(router.url, TOKEN)
    proc = controller_proc(router.url, journal, interval="3s")
    try:
        with BackgroundLoad(router.url, "pub", concurrency=4, max_tokens=4, timeout_s=90) as load:
            wait_for(lambda: client.state().weights.get("canary") == 50, 60, "the 50% step")
            router.stop(signal.SIGKILL)
            time.sleep(0.5)
            router = router_on(tmp_path, port, a.url, b.url)  # back with its configured 100/0
            back = time.monotonic()
            wait_for(lambda: client.state().weights == {"stable": 50, "canary": 50}, 10, "weights re-applied")
            reapplied_after = time.monotonic() - back
            out, err = proc.communicate(timeout=90)
        assert reapplied_after < 3.0 + 1.5, reapplied_after  # within one window (3 s) and a check
        assert proc.returncode == 0, err[-3000:]
        st = json.loads(out)
        assert st["state"] == "promoted" and client.state().weights == {"stable": 0, "canary": 100}
        drift = [e for e in st["events"] if e["kind"] == "drift"]
        assert drift and drift[0]["detail"]["journaled"] == {"stable": 50, "canary": 50}
        assert st["drifts"] >= 1
        # the window the router died in was discarded, never judged against the canary
        assert all(w["action"] in ("advance", "hold") for s in st["steps"] for w in s["windows"])
        assert load.result.ok > 0
    finally:
        stop_all(proc, router)


def test_abort_against_a_dead_router_converges_when_it_is_back(run_cli, tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    a, b = backends
    port = free_port()
    router = router_on(tmp_path, port, a.url, b.url)
    journal = tmp_path / "j.sqlite"
    client = RouterClient(router.url, TOKEN)
    proc = controller_proc(router.url, journal, interval="30s")
    try:
        wait_for(lambda: client.state().weights.get("canary") == 10, 30, "the 10% step")
        proc.send_signal(signal.SIGKILL)  # nobody else will retry: only the commands
        proc.wait(10)
        router.stop(signal.SIGKILL)
        r = run_cli("promote", "abort", "--journal", journal)
        assert r.exit_code == 8, r.stderr
        assert "abort_requested" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        again = run_cli("promote", "abort", "--journal", journal)  # still down: still requested, never "already"
        assert again.exit_code == 8 and "already" not in again.stderr
        st = json.loads(run_cli("promote", "status", "--journal", journal, "--json").stdout)
        assert st["state"] == "abort_requested" and st["weights"] == {"stable": 100, "canary": 0}
        assert not st["weights_applied"]
        router = router_on(tmp_path, port, a.url, b.url)
        RouterClient(router.url, TOKEN).set_weights({"stable": 90, "canary": 10})  # as it was when it died
        r = run_cli("promote", "abort", "--journal", journal, "--json")
        assert r.exit_code == 0, r.stderr
        st = json.loads(r.stdout)
        assert st["state"] == "aborted" and st["weights_applied"]
        assert RouterClient(router.url, TOKEN).state().weights == {"stable": 100, "canary": 0}
    finally:
        stop_all(proc, router)


def test_unknown_version_names_journal_nothing(run_cli, tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    a, b = backends
    router = router_on(tmp_path, free_port(), a.url, b.url)
    journal = tmp_path / "j.sqlite"
    try:
        r = run_cli("promote", "start", "--router", router.url, "--stable", "stable", "--canary", "canry",
                    "--journal", journal)
        assert r.exit_code == 2 and "canry" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        with Journal(journal) as j:
            assert j.latest() is None
        assert RouterClient(router.url, TOKEN).state().weights == {"stable": 100, "canary": 0}
        # the right names start at once: nothing was left behind to refuse them
        with BackgroundLoad(router.url, "pub", concurrency=4, max_tokens=4, timeout_s=60):
            ok = run_cli(*promote_args(router.url, journal, "--steps", "50,100"))
        assert ok.exit_code == 0, ok.stderr
        # a promoted journal: `start` starts nothing without --new
        again = run_cli(*promote_args(router.url, journal, "--steps", "50,100"))
        assert again.exit_code == 2 and "--new" in again.stderr, again.stderr
        assert RouterClient(router.url, TOKEN).state().weights == {"stable": 0, "canary": 100}
    finally:
        router.stop()


def test_status_says_whether_a_controller_is_alive(run_cli, tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    a, b = backends
    router = router_on(tmp_path, free_port(), a.url, b.url)
    journal = tmp_path / "j.sqlite"
    proc = controller_proc(router.url, journal, interval="30s")
    try:
        wait_for(lambda: RouterClient(router.url, TOKEN).state().weights.get("canary") == 10, 30, "the 10% step")
        st = json.loads(run_cli("promote", "status", "--journal", journal, "--json").stdout)
        assert st["controller"]["pid"] == proc.pid and st["controller"]["alive"]
        assert st["controller"]["heartbeat_age_s"] < 5
        assert st["steps"][0]["judged"].startswith("each 30s window: canary vs stable at 10%")
        assert "no window" in st["steps"][-1]["judged"]  # the final step says what decides it
        assert {c["name"] for c in st["compares"]} >= {"error_rate", "latency", "ttft"}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        text = run_cli("promote", "status", "--journal", journal)
        assert "controller: none running" in text.stdout, text.stdout
        st = json.loads(run_cli("promote", "status", "--journal", journal, "--json").stdout)
        assert st["state"] == "progressing" and st["controller"]["alive"] is False
    finally:
        stop_all(proc, router)


def test_shadow_phase_passes_a_healthy_canary_then_users_see_it(run_cli, tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    a, b = backends
    router = router_on(tmp_path, free_port(), a.url, b.url)
    journal = tmp_path / "j.sqlite"
    client = RouterClient(router.url, TOKEN)
    try:
        with BackgroundLoad(router.url, "pub", concurrency=4, max_tokens=4, timeout_s=90) as load:
            r = run_cli(*promote_args(router.url, journal, "--shadow", "50%", "--shadow-windows", "2",
                                      "--shadow-min-pairs", "5", "--steps", "50,100", interval="2s"))
        assert r.exit_code == 0, r.stderr
        st = json.loads(r.stdout)
        assert st["state"] == "promoted" and client.state().weights == {"stable": 0, "canary": 100}
        shadow = st["shadow"]["windows"]
        assert [w["action"] for w in shadow if w["action"] != "hold"] == ["pass", "advance"], shadow
        assert all(w["source"] == "shadow" and w["canary"]["requests"] > 0 for w in shadow)
        states = [e["detail"]["to"] for e in st["events"] if e["kind"] == "state"]
        assert states == ["progressing", "promoted"]  # shadowing -> progressing -> promoted
        assert client.state().shadow is None  # mirroring off once the phase passed
        assert load.result.errors == 0
    finally:
        router.stop()


def test_shadow_phase_fails_a_bad_canary_before_any_user_sees_it(run_cli, tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from faults import FaultProxy

    a, b = backends
    with FaultProxy(b.url, fail_status=500) as proxy:
        router = router_on(tmp_path, free_port(), a.url, proxy.url)
        journal = tmp_path / "j.sqlite"
        try:
            with BackgroundLoad(router.url, "pub", concurrency=4, max_tokens=4, timeout_s=90) as load:
                r = run_cli(*promote_args(router.url, journal, "--shadow", "50%", "--shadow-min-pairs", "5",
                                          interval="3s"))
            assert r.exit_code == 10, r.stderr
            st = json.loads(r.stdout)
            assert st["state"] == "rolled_back" and st["reason"].startswith("shadow phase")
            assert [s["started_at"] for s in st["steps"]] == [None, None, None]  # no step ever began
            assert st["weight_changes"][0]["weights"] == {"stable": 100, "canary": 0}
            assert {tuple(sorted(c["weights"].items())) for c in st["weight_changes"]} == {
                (("canary", 0), ("stable", 100))}
            assert proxy.requests_seen > 0  # the canary did get the mirrored copies ...
            assert load.result.backends.get("canary", 0) == 0 and load.result.ok > 0  # ... and no user its answer
            assert load.result.errors == 0
            assert json.loads(run_cli("promote", "status", "--journal", journal, "--json").stdout)["shadow"]
        finally:
            router.stop()
