"""Ctrl-C and SIGTERM take effect in seconds even while a server stalls, and `qlift eval
--backend endpoint` survives a flaky server: answers are cached as they arrive, 429/5xx are
retried, and a rerun asks only for what is missing (issue: hardening).

The endpoint here is a small failure-injecting OpenAI server (stdlib HTTP on 127.0.0.1): it
fails, stalls and counts on demand, which a real vLLM will not do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_download import BIG, REPO, Fault, HubServer, tiny_files

PROMPTS = [f"Question {i}: what is {i} + {i}?" for i in range(8)]


class FlakyOpenAI:
    """Answers chat completions with the prompt echoed back, unless told to fail or stall."""

    def __init__(self) -> None:
        self.fail_when: str | None = None  # a prompt containing this answers 503, every time
        self.fail_first = 0  # the first N chat requests answer 503 (then the server recovers)
        self.stall = False  # accept chat requests and never answer
        self.prompts: Counter[str] = Counter()  # chat requests seen, per prompt
        self.lock = threading.Lock()
        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: dict) -> None:  # type: ignore[type-arg]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "flaky", "root": "/models/flaky"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    self._send(404, {"error": {"message": "no tokenize here"}})
                    return
                prompt = body["messages"][-1]["content"]
                with owner.lock:
                    owner.prompts[prompt] += 1
                    failing = owner.fail_first > 0
                    owner.fail_first -= failing
                if owner.stall:
                    owner.release.wait(60)
                    return
                if failing or (owner.fail_when and owner.fail_when in prompt):
                    self._send(503, {"error": {"message": "overloaded", "type": "ServiceUnavailable"}})
                    return
                self._send(200, {"choices": [{"message": {"role": "assistant", "content": f"echo: {prompt}"},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 5, "completion_tokens": 3}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FlakyOpenAI:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    rows = [{"id": f"q{i}", "messages": [{"role": "user", "content": p}], "reference": str(2 * i)}
            for i, p in enumerate(PROMPTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FlakyOpenAI]:
    monkeypatch.setenv("QLIFT_EVAL_CACHE", str(tmp_path / "eval-cache"))
    monkeypatch.setattr("qlift.eval.endpoint.BACKOFF_S", 0.01)
    with FlakyOpenAI() as server:
        yield server


def test_a_failure_keeps_every_answer_so_far_and_the_rerun_sends_only_the_rest(run_cli, flaky,
                                                                                prompts_file: Path) -> None:
    prompts = PROMPTS
    flaky.fail_when = prompts[-1]
    argv = ["eval", "flaky", "--endpoint", flaky.url, "--prompts", prompts_file, "--metrics", "exact_match"]
    r = run_cli(*argv)
    assert r.exit_code == 8, r.stderr
    assert "answered HTTP 503" in r.stderr and "a rerun asks only for the answers still missing" in r.stderr
    assert flaky.prompts[prompts[-1]] == 5  # the first try and 4 retries, then it gave up
    assert all(flaky.prompts[p] == 1 for p in prompts[:-1])

    flaky.fail_when = None
    flaky.prompts.clear()
    r = run_cli(*argv, "--json")
    assert r.exit_code == 0, r.stderr
    assert dict(flaky.prompts) == {prompts[-1]: 1}  # only the one still missing
    cache = json.loads(r.stdout)["cache"]
    assert (cache["hits"], cache["misses"]) == (len(prompts) - 1, 1)


def test_503s_are_retried_and_the_client_sees_none(run_cli, flaky, prompts_file: Path) -> None:
    flaky.fail_first = 3
    r = run_cli("eval", "flaky", "--endpoint", flaky.url, "--prompts", prompts_file, "--metrics", "exact_match",
                "--concurrency", "2", "--json")
    assert r.exit_code == 0, r.stderr
    assert sum(flaky.prompts.values()) == len(PROMPTS) + 3


def _qlift(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    # SIGINT as a terminal gives it: a suite started in the background (`cmd &` in a script) hands its children
    # SIGINT ignored, and qlift, like any program, keeps a disposition it was given ignored.
    return subprocess.Popen([sys.executable, "-m", "qlift", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _interrupt_within(proc: subprocess.Popen[str], signum: int, limit_s: float) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=limit_s + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err, time.monotonic() - t0


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_eval_against_a_stalled_server_stops_in_seconds(flaky, prompts_file: Path, tmp_path: Path, signum: int,
                                                        code: int) -> None:
    flaky.stall = True
    env = {**os.environ, "QLIFT_EVAL_CACHE": str(tmp_path / "cache")}
    proc = _qlift(["eval", "flaky", "--endpoint", flaky.url, "--prompts", str(prompts_file), "--metrics", "exact_match",
                   "--concurrency", "4"], env)
    deadline = time.monotonic() + 60
    while sum(flaky.prompts.values()) < 4:  # all four workers are stuck in a request
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    rc, err, took = _interrupt_within(proc, signum, 3.0)
    assert rc == code, err
    assert took < 3.0, f"took {took:.1f} s"
    assert "Traceback" not in err


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_download_from_a_stalled_server_stops_in_seconds_and_resumes(run_cli, tmp_path: Path, monkeypatch,
                                                                     signum: int, code: int) -> None:  # type: ignore[no-untyped-def]
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.chdir(tmp_path)
    files = tiny_files()
    with HubServer() as hub:
        hub.commit(REPO, files)
        stall_at = 256 * 1024
        hub.faults[BIG] = Fault(stall_after=stall_at)
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_TOKEN")}
        env.update(HF_HOME=str(tmp_path / "hf-home"))
        proc = _qlift(["download", REPO, "-o", "m", "--endpoint", hub.url, "--max-workers", "2"], env)
        try:
            hub.wait_sent(BIG, stall_at)
            time.sleep(0.3)
            rc, err, took = _interrupt_within(proc, signum, 3.0)
        finally:
            hub.faults[BIG].release.set()
        assert rc == code, err
        assert took < 3.0, f"took {took:.1f} s"
        assert not Path("m").exists() and Path(".m.qlift-download").is_dir()  # resumable state kept
        del hub.faults[BIG]
        r = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url)
        assert r.exit_code == 0, r.stderr
        assert "resuming:" in r.stderr
        assert Path("m", BIG).read_bytes() == files[BIG]
