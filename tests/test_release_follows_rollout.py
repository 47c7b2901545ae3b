"""The release journal follows its rollout (#54): a rollout the release started and an operator ended with
`qlift promote resume` or `abort` leaves the release done or aborted, journaled once with where it came from, and
a re-run says what it really does; a `url:` stage that nothing answers fails before anything starts; the servers
start together; the release's own load carries no session key. On the real router with small stub backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from faults import BackgroundLoad, RouterProcess, TinyBackend, until

from qlift.release.journal import RunOutcome
from qlift.router.client import RouterClient
from qlift.vllm.process import free_port

TOKEN = "follow-test-token"


def _env() -> dict[str, str]:
    return {**os.environ, "QLIFT_ROUTER_TOKEN": TOKEN}


def _qlift(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qlift", *map(str, args)], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


def _release(path: Path, base: Path, stable: str, canary: str, router: str, interval: str = "3s") -> Path:
    stages = [{"stage": "serve", "name": "stable", "options": {"role": "stable", "url": stable}},
              {"stage": "serve", "name": "canary", "options": {"role": "candidate", "url": canary}},
              {"stage": "router", "options": {"url": router}},
              {"stage": "promote", "options": {"steps": [50, 100], "interval": interval,
                                               "analysis": {"min_requests": 3}}}]
    doc = {"name": "follow", "out": "out", "base": {"path": str(base)}, "stages": stages}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _stopped_at_the_first_step(tmp_path: Path, base: Path, a: TinyBackend, b: TinyBackend,
                               router: RouterProcess) -> tuple[Path, Path]:
    """A `release run --yes` SIGTERMed once its rollout holds 50/50: the release journal says promote failed."""
    f = _release(tmp_path / "release.yaml", base, a.url, b.url, router.url)
    proc = subprocess.Popen([sys.executable, "-m", "qlift", "release", "run", str(f), "--yes"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    client = RouterClient(router.url, TOKEN)
    until(lambda: client.state().weights == {"stable": 50, "canary": 50}, 60, "the first step", every_s=0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    return f, tmp_path / "out" / "rollout-1.sqlite"


def _router(tmp_path: Path, a: TinyBackend, b: TinyBackend) -> RouterProcess:
    return RouterProcess("--backend", f"stable={a.url}", "--backend", f"canary={b.url}", "--public-model", "pub",
                         "--weight", "stable=100", "--weight", "canary=0", log_path=tmp_path / "router.log",
                         token=TOKEN)


def _stages(r: Any) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in json.loads(r.stdout)["stages"]}


def test_a_release_promoted_by_promote_resume_is_done_and_a_rerun_runs_nothing(
        run_cli, tmp_path: Path, tiny_qwen2_tied: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)
    with TinyBackend("m-stable", tokens=2) as a, TinyBackend("m-canary", tokens=2) as b, \
            _router(tmp_path, a, b) as router:
        f, journal = _stopped_at_the_first_step(tmp_path, tiny_qwen2_tied, a, b, router)
        load = BackgroundLoad(router.url, "pub", concurrency=2, max_tokens=2).start()
        try:
            resumed = _qlift("promote", "resume", "--journal", journal)  # what release status's next: says
        finally:
            load.stop()
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        client = RouterClient(router.url, TOKEN)
        assert client.state().weights == {"stable": 0, "canary": 100}

        # The next release command journals the rollout's outcome, once, saying where it came from.
        r = run_cli("release", "status", f, "--json")
        assert r.exit_code == 0, r.stderr
        said = "promote: rollout promoted outside this release ("
        assert said in r.stderr and f"as its own journal {journal} says" in r.stderr, r.stderr
        status = json.loads(r.stdout)
        assert status["last_run"]["outcome"] == "done" and str(journal) in status["last_run"]["detail"]
        assert {s["name"]: s["status"] for s in status["stages"]}["promote"] == "done"
        assert status["rollout"]["state"] == "promoted" and status["rollout"]["next"] == []
        again = run_cli("release", "status", f)
        assert said not in again.stderr  # journaled once
        assert "promote          done" in again.stdout and "next:" not in again.stdout, again.stdout

        # A re-run says it does nothing, asks nothing (no --yes, no terminal), and does nothing.
        plan = run_cli("release", "run", f, "--dry-run", "--json")
        assert plan.exit_code == 0, plan.stderr
        assert _stages(plan)["promote"]["action"] == "skip", plan.stdout
        assert _stages(plan)["promote"]["reason"].startswith("promoted already with key")
        assert "go back to the stable" not in plan.stderr
        rerun = run_cli("release", "run", f, "--json")
        assert rerun.exit_code == 0, rerun.stderr
        assert {s["action"] for n, s in _stages(rerun).items() if n != "base"} == {"skipped"}
        assert client.state().weights == {"stable": 0, "canary": 100}

        # Changed options run promote again, which would refuse at canary 100%: said so, and refused up front.
        f = _release(f, tiny_qwen2_tied, a.url, b.url, router.url, interval="4s")
        plan = run_cli("release", "run", f, "--dry-run", "--json")
        warning = _stages(plan)["promote"]["warning"]
        assert warning.startswith(f"promote would refuse to start: a rollout starts from the stable at 100% and "
                                  f"{router.url} does not hold it (canary=100, stable=0); the canary was promoted")
        assert "go back to the stable" not in plan.stderr
        refused = run_cli("release", "run", f, "--yes")
        assert refused.exit_code == 2 and "promote would refuse to start" in refused.stderr, refused.stderr
        assert client.state().weights == {"stable": 0, "canary": 100}


def test_a_release_aborted_by_promote_abort_says_a_rerun_rolls_out_again(
        run_cli, tmp_path: Path, tiny_qwen2_tied: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)
    with TinyBackend("m-stable", tokens=2) as a, TinyBackend("m-canary", tokens=2) as b, \
            _router(tmp_path, a, b) as router:
        f, journal = _stopped_at_the_first_step(tmp_path, tiny_qwen2_tied, a, b, router)
        aborted = _qlift("promote", "abort", "--journal", journal)
        assert aborted.returncode == 0, aborted.stderr[-2000:]

        plan = run_cli("release", "run", f, "--dry-run", "--json")
        assert plan.exit_code == 0, plan.stderr
        assert "promote: rollout aborted outside this release (" in plan.stderr, plan.stderr
        promote = _stages(plan)["promote"]
        assert promote["action"] == "run"
        assert promote["reason"] == (f"a new rollout from the first step (stable=50, canary=50 at the first step), in "
                                     f"a new rollout journal; the last one ({journal}) ended aborted")
        assert promote["warning"] == f"will run promote: moves live traffic on {router.url} (now canary=0, stable=100)"
        status = json.loads(run_cli("release", "status", f, "--json").stdout)
        assert status["last_run"]["outcome"] == "failed" and "aborted outside this release" in \
            status["last_run"]["detail"]
        assert status["rollout"]["state"] == "aborted" and status["rollout"]["next"] == []


def test_a_url_stage_that_nothing_answers_fails_before_anything_starts(
        run_cli, tmp_path: Path, tiny_qwen2_tied: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with TinyBackend("m-stable") as a, TinyBackend("m-canary") as b:
        f = _release(tmp_path / "release.yaml", tiny_qwen2_tied, a.url, dead, a.url)
        plan = run_cli("release", "run", f, "--dry-run", "--json")
        assert _stages(plan)["canary"]["reason"].startswith(f"nothing answers at {dead} (")
        assert _stages(plan)["stable"]["reason"] == f"a running server: {a.url}"
        r = run_cli("release", "run", f, "--yes")
        assert r.exit_code == 8, r.stderr
        assert f"error: stage 'canary': nothing answers at {dead} (" in r.stderr
        assert "ran" not in r.stderr.split("error:")[0], r.stderr  # no stage said it runs
        assert f"or fix the stage's url: in {f}" in r.stderr

        f = _release(tmp_path / "release.yaml", tiny_qwen2_tied, a.url, b.url, a.url)  # a vLLM-like, no router
        r = run_cli("release", "run", f, "--yes")
        assert r.exit_code == 8 and f"stage 'router': {a.url}/health does not answer as a qlift router's" in r.stderr


def test_the_servers_start_together_each_on_its_core(tmp_path: Path, tiny_qwen2_tied: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from qlift import serve
    from qlift.release import load_release, run_release

    calls: list[dict[str, Any]] = []

    class Handle:
        def __init__(self, port: int) -> None:
            self.pid, self.base_url = os.getpid(), f"http://127.0.0.1:{port}/v1"
            self.thread = threading.current_thread()

        def stop(self) -> None:
            # vLLM dies with the thread that started it (PR_SET_PDEATHSIG): that thread lives until the stop
            calls.append({"stopped_while_starter_alive": self.thread.is_alive()})

    def start(inputs: Any, options: Any, *, keep: bool = False, on_started: Any = None) -> Handle:
        began = time.monotonic()
        on_started(os.getpid())
        time.sleep(1.5)  # a vLLM start, in short
        calls.append({"core": inputs.env["VLLM_CPU_OMP_THREADS_BIND"], "began": began, "ended": time.monotonic()})
        return Handle(free_port())

    monkeypatch.setattr(serve, "start", start)
    f = tmp_path / "release.yaml"
    f.write_text(yaml.safe_dump({"name": "two", "out": "out", "base": {"path": str(tiny_qwen2_tied)}, "stages": [
        {"stage": "serve", "name": "stable", "options": {"role": "stable", "core": 0}},
        {"stage": "serve", "name": "canary", "options": {"role": "candidate", "core": 1}}]}), encoding="utf-8")
    t0 = time.monotonic()
    reports = run_release(load_release(f), echo=lambda line: None)
    took = time.monotonic() - t0
    started = [c for c in calls if "core" in c]
    assert sorted(c["core"] for c in started) == ["0", "1"]
    assert max(c["began"] for c in started) < min(c["ended"] for c in started), started  # they overlapped
    assert took < 2.9, took
    assert [r.name for r in reports if r.action == "ran"] == ["stable", "canary"]
    assert [c for c in calls if "stopped_while_starter_alive" in c] == [{"stopped_while_starter_alive": True}] * 2


def test_the_releases_own_load_carries_no_session_key_so_the_first_window_sees_the_canarys_share(
        tmp_path: Path) -> None:
    from qlift.release.live import Traffic
    from qlift.release.stage_options import LoadOptions

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n", encoding="utf-8")
    with TinyBackend("m-stable", tokens=1) as a, TinyBackend("m-canary", tokens=1) as b, \
            RouterProcess("--backend", f"stable={a.url}", "--backend", f"canary={b.url}", "--public-model", "pub",
                          "--weight", "stable=90", "--weight", "canary=10", log_path=tmp_path / "router.log",
                          token=TOKEN) as router:
        with Traffic(router.url, "pub", LoadOptions(prompts=prompts, concurrency=1, max_requests=100,
                                                    max_tokens=1)) as traffic:
            until(lambda: sum(traffic.status.values()) >= 100, 60, "100 requests")
        assert traffic.status[200] == 100
        records = RouterClient(router.url, TOKEN).requests().requests
        assert records and not any(r.session for r in records)
        assert sum(r.backend == "canary" for r in records) == 10  # one deck: the share exactly


def test_the_hints_a_release_prints_name_its_rollout_journal(run_cli, tmp_path: Path, tiny_qwen2_tied: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A pause's `qlift promote resume`, logged by the release's controller or kept as the rollout's reason, names
    that run's rollout journal: as printed, the default journal would be the wrong one."""
    import logging

    from qlift.release.journal import ReleaseJournal, StageStatus
    from qlift.release.live import hints_name_journal

    journal = tmp_path / "out" / "rollout-1.sqlite"
    reason = "too little canary traffic: 0 canary requests in 3 window(s); then `qlift promote resume`"
    with caplog.at_level(logging.WARNING, logger="qlift"), hints_name_journal(journal):
        logging.getLogger("qlift.rollout.controller").warning("%s: %s", "paused", reason)
    assert caplog.messages == [f"paused: {reason[:-1]} --journal {journal}`"]

    dead = "http://127.0.0.1:1"
    f = _release(tmp_path / "release.yaml", tiny_qwen2_tied, dead, dead, dead)
    with ReleaseJournal(tmp_path / "out" / "release.sqlite") as j:
        run_id = j.start_run(f)
        j.begin("promote", "sha256:p", "")
        j.end("promote", "sha256:p", StageStatus.FAILED,
              result={"state": "paused", "reason": reason, "journal": str(journal)})
        j.finish_run(run_id, RunOutcome.FAILED, "Terminated")
    shown = run_cli("release", "status", f).stdout
    assert f"rollout paused: {reason[:-1]} --journal {journal}`" in shown.splitlines(), shown
