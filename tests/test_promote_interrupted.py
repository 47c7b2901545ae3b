"""An interrupted rollout tells the truth, on the real router with small real backends: a `qlift release run`
SIGTERM'd mid-promote and a controller stopped with Ctrl-C (SIGINT) show in `release status`, `promote status`,
`--json` and the page as interrupted (how, when, at which weights), with the router's real weights and the
release's servers; and every command a hint prints is run as printed and works."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from faults import RouterProcess, TinyBackend, until

from qlift.router.client import RouterClient

TOKEN = "interrupted-test-token"
REPO = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return {**os.environ, "QLIFT_ROUTER_TOKEN": TOKEN}


def _qlift(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "qlift", *map(str, args)], capture_output=True, text=True,
                              env=_env(), timeout=timeout)
    except subprocess.TimeoutExpired as exc:  # what it said before it was killed, to read in the failure
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        raise AssertionError(f"qlift {' '.join(map(str, args))} ran past {timeout:g}s:\n{said[-4000:]}") from None


def _popen(argv: list[str]) -> subprocess.Popen[str]:
    # SIGINT as a terminal gives it (a suite started in the background hands its children SIGINT ignored).
    return subprocess.Popen([sys.executable, "-m", "qlift", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def hinted(text: str) -> list[str]:
    """Every `qlift ...` command a hint quotes."""
    return re.findall(r"`(qlift [^`]+)`", text)


def _run_hint(command: str) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(command)
    assert argv[0] == "qlift"
    return _qlift(*argv[1:])


def _release(path: Path, base: Path, stages: list[dict[str, Any]]) -> Path:
    doc = {"name": "interrupted", "out": "out", "base": {"path": str(base)}, "stages": stages}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _rollout_weights(journal: Path) -> dict[str, int] | None:
    """The weights the rollout journal says were applied (None before the first)."""
    if not journal.exists():
        return None
    from qlift.errors import QliftError
    from qlift.rollout.status import rollout_status

    try:
        st = rollout_status(journal)
    except QliftError:
        return None
    return st.weights if st.weights_applied else None


def _stop(proc: subprocess.Popen[str], signum: int, code: int) -> str:
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err[-2000:]
    return err


def test_a_sigtermd_release_then_a_ctrl_cd_resume_show_as_interrupted_and_every_hint_works(
        tmp_path: Path, tiny_qwen2_tied: Path) -> None:
    with TinyBackend("m-stable", tokens=4) as a, TinyBackend("m-canary", tokens=4) as b, \
            RouterProcess("--backend", f"stable={a.url}", "--backend", f"canary={b.url}", "--public-model", "pub",
                          "--weight", "stable=100", "--weight", "canary=0", log_path=tmp_path / "router.log",
                          token=TOKEN) as router:
        client = RouterClient(router.url, TOKEN)
        f = _release(tmp_path / "release.yaml", tiny_qwen2_tied, [
            {"stage": "serve", "name": "stable", "options": {"role": "stable", "url": a.url}},
            {"stage": "serve", "name": "canary", "options": {"role": "candidate", "url": b.url}},
            {"stage": "router", "options": {"url": router.url}},
            {"stage": "promote", "options": {"steps": [50, 100], "interval": "60s"}}])
        release = _popen(["release", "run", str(f), "--yes"])
        until(lambda: client.state().weights == {"stable": 50, "canary": 50}, 60, "the first step's weights",
              every_s=0.1)
        _stop(release, signal.SIGTERM, 143)

        # release status reads the rollout's own journal: at 50/50, progressing, stopped by SIGTERM.
        r = _qlift("release", "status", f, "--json")
        assert r.returncode == 0, r.stderr
        rollout = json.loads(r.stdout)["rollout"]
        journal = tmp_path / "out" / "rollout-1.sqlite"
        assert rollout["journal"] == str(journal)
        assert rollout["state"] == "progressing" and rollout["weights"] == {"stable": 50, "canary": 50}
        assert rollout["interrupted"].startswith("interrupted by SIGTERM at ")
        assert rollout["router"]["weights"] == {"stable": 50, "canary": 50}  # read from the router itself
        assert [(s["stage"], s["answers"]) for s in rollout["servers"]] == [
            ("stable", True), ("canary", True), ("router", True)]
        text = _qlift("release", "status", f).stdout
        assert "not started" not in text and "Terminated" not in text.split("rollout ", 1)[1], text
        assert "rollout progressing at step 1/2, weights stable 50% / canary 50%" in text
        assert f"router {router.url} holds stable 50% / canary 50%" in text
        hints = hinted(text)
        resume = f"qlift promote resume --journal {journal}"
        assert resume in hints and f"qlift promote abort --journal {journal}" in hints, hints
        assert _run_hint(f"qlift promote status --journal {journal}").returncode == 0

        # The printed resume goes on at the step; a second start meanwhile is refused with a hint that works.
        controller = _popen(shlex.split(resume)[1:])
        until(lambda: any(i["resumed_at"] for i in json.loads(
            _qlift("promote", "status", "--journal", journal, "--json").stdout)["interruptions"]), 60, "the resume",
              every_s=0.1)
        again = _qlift("promote", "start", "--router", router.url, "--stable", "stable", "--canary", "canary",
                       "--steps", "50,100", "--journal", journal)
        assert again.returncode != 0 and "already running" in again.stderr, again.stderr
        [watch] = hinted(again.stderr)
        assert watch == f"qlift promote status --journal {journal}"
        assert _run_hint(watch).returncode == 0
        _stop(controller, signal.SIGINT, 130)  # Ctrl-C

        # promote status, --json and the page: both stops, the resume between them, the router's weights now.
        st = json.loads(_qlift("promote", "status", "--journal", journal, "--json").stdout)
        stops = st["interruptions"]
        assert [i["how"] for i in stops] == ["SIGTERM", "SIGINT (Ctrl-C)"]
        assert stops[0]["resumed_at"] and stops[1]["resumed_at"] is None
        assert all(i["weights"] == {"stable": 50, "canary": 50} and i["state"] == "progressing" for i in stops)
        assert st["interrupted"]["how"] == "SIGINT (Ctrl-C)"
        assert st["live"] == {"url": router.url, "weights": {"stable": 50, "canary": 50}, "error": None}
        shown = _qlift("promote", "status", "--journal", journal)
        assert "controller: none running (interrupted by SIGINT (Ctrl-C) at " in shown.stdout, shown.stdout
        assert "controller interrupted by SIGTERM at " in shown.stdout and "; resumed at " in shown.stdout
        assert f"router {router.url} now holds stable 50% / canary 50%" in shown.stdout
        page = tmp_path / "rollout.html"
        assert _qlift("promote", "report", "-o", page, "--journal", journal).returncode == 0
        html = page.read_text(encoding="utf-8")
        assert "interrupted by SIGTERM" in html and "interrupted by SIGINT (Ctrl-C)" in html

        # Every command the status suggests works as printed; abort returns every user to the stable.
        suggested = hinted(shown.stdout)
        assert f"qlift promote resume --journal {journal}" in suggested
        abort = f"qlift promote abort --journal {journal}"
        assert abort in suggested, suggested
        r = _run_hint(abort)
        assert r.returncode == 0, r.stderr
        assert client.state().weights == {"stable": 100, "canary": 0}
        final = _qlift("release", "status", f)
        assert "rollout aborted" in final.stdout and "next:" not in final.stdout, final.stdout


def test_a_sigtermd_release_whose_router_it_started_says_run_the_release_again(
        tmp_path: Path, tiny_qwen2_tied: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n", encoding="utf-8")
    with TinyBackend("m-stable", tokens=4) as a, TinyBackend("m-canary", tokens=4) as b:
        f = _release(tmp_path / "release.yaml", tiny_qwen2_tied, [
            {"stage": "serve", "name": "stable", "options": {"role": "stable", "url": a.url}},
            {"stage": "serve", "name": "canary", "options": {"role": "candidate", "url": b.url}},
            {"stage": "router", "options": {}},
            {"stage": "promote", "options": {"steps": [50, 100], "interval": "3s", "analysis": {"min_requests": 3}},
             # instant backends answer ~400 requests/s: the default 2,000 would be spent before the first window
             "load": {"prompts": str(prompts), "concurrency": 2, "max_tokens": 4, "max_requests": 1_000_000}}])
        journal = tmp_path / "out" / "rollout-1.sqlite"
        release = _popen(["release", "run", str(f)])
        until(lambda: _rollout_weights(journal) == {"stable": 50, "canary": 50}, 60, "the first step's weights",
              every_s=0.1)
        _stop(release, signal.SIGTERM, 143)

        r = _qlift("release", "status", f, "--json")
        rollout = json.loads(r.stdout)["rollout"]
        assert rollout["state"] == "progressing" and rollout["interrupted"].startswith("interrupted by SIGTERM")
        router = next(s for s in rollout["servers"] if s["kind"] == "router")
        assert router["started_by_release"] and not router["pid_alive"] and not router["answers"]
        assert rollout["router"]["weights"] is None  # gone with the run that started it
        text = _qlift("release", "status", f).stdout
        assert "promote resume" not in text, text  # its router is gone: a resume could not work
        again = hinted(text.split("next: ", 1)[1])[0]
        assert again == f"qlift release run {f}"
        r = _run_hint(again)  # starts the router again and rolls out from the first step, in a new journal
        assert r.returncode == 0, r.stderr[-3000:]
        final = json.loads(_qlift("release", "status", f, "--json").stdout)["rollout"]
        assert final["state"] == "promoted" and final["journal"] == str(tmp_path / "out" / "rollout-2.sqlite")
