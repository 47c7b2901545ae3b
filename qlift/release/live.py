"""The release's live stages: servers (`qlift serve`), the router (`qlift router`) and promote.

Servers and the router run as `qlift` child processes, started the way a release engineer
starts them (each prints one JSON ready line); each pid is journaled before anything waits on
it, and they are stopped by pid when the release ends (unless the file keeps them running).
Promote runs in this process through ``qlift.rollout.start``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from qlift.errors import ExternalToolError
from qlift.release.journal import ReleaseJournal
from qlift.release.spec import LoadOptions, RouterStageOptions, ServeStageOptions

log = logging.getLogger(__name__)
QLIFT = [sys.executable, "-m", "qlift"]


class Processes:
    """The children a release started, journaled by pid; ``stop`` ends them in reverse order."""

    def __init__(self, journal: ReleaseJournal, run_id: int, logs: Path) -> None:
        self.journal, self.run_id, self.logs = journal, run_id, logs
        self.procs: list[tuple[subprocess.Popen[str], bool]] = []

    def start(self, stage: str, argv: list[str], env: dict[str, str], *, keep: bool) -> dict[str, Any]:
        """Start ``qlift ARGV`` and return its JSON ready line (its stderr goes to logs/STAGE.log)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{stage}.log"
        with open(log_path, "w") as err:
            proc = subprocess.Popen([*QLIFT, *argv], stdout=subprocess.PIPE, stderr=err, text=True,
                                    env={**os.environ, **env}, start_new_session=True)
        self.journal.add_server(proc.pid, stage, self.run_id, "")
        self.procs.append((proc, keep))
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            tail = " ".join(log_path.read_text(errors="replace").strip().splitlines()[-1:])
            raise ExternalToolError(f"stage '{stage}': `qlift {argv[0]}` exited with code {proc.wait()}: {tail}",
                                    hint=f"See {log_path}.", tool=argv[0])
        ready: dict[str, Any] = json.loads(line)
        self.journal.add_server(proc.pid, stage, self.run_id, str(ready.get("base_url") or ready.get("url")))
        if keep:  # the release will not stop it: nothing of it is ours to track any more
            self.journal.server_stopped(proc.pid)
        return ready

    def stop(self) -> None:
        for proc, keep in reversed(self.procs):
            if not keep and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, keep in reversed(self.procs):
            if keep:
                continue
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self.journal.server_stopped(proc.pid)


def stop_leftovers(journal: ReleaseJournal) -> list[int]:
    """Stop the servers a killed run of this release left running (journaled pids that are still a
    `qlift serve` / `qlift router` of ours; a reused pid is left alone)."""
    stopped = []
    for row in journal.running_servers():
        pid = int(row["pid"])
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            journal.server_stopped(pid)
            continue
        if b"qlift" in cmdline and (b"serve" in cmdline or b"router" in cmdline):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
        journal.server_stopped(pid)
    return stopped


def serve_argv(model: Path, o: ServeStageOptions) -> tuple[list[str], dict[str, str]]:
    from qlift.cli.options import cli_args
    from qlift.serve.options import ServeOptions

    serve = ServeOptions(recipe=o.recipe, sets=tuple(o.sets), port=o.port, timeout_s=o.timeout_s,
                         served_model_name=o.served_model_name or f"qlift-{o.role}")
    argv = ["serve", str(model), *cli_args(serve), "--json"]
    env = {}
    if o.core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(o.core)
    if o.kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(o.kv_cache_gib)
    return argv, env


def router_argv(o: RouterStageOptions, backends: dict[str, str]) -> list[str]:
    argv = ["router", "--public-model", o.public_model, "--port", str(o.port), "--json",
            "--weight", "stable=100", "--weight", "canary=0"]
    for name, url in backends.items():
        argv += ["--backend", f"{name}={url.rstrip('/').removesuffix('/v1')}"]
    return argv


def new_router_token() -> str:
    return secrets.token_hex(16)


class Traffic:
    """Streamed chats through the router from a prompt file, a few at a time, until stopped (at most
    ``max_requests``); each conversation carries a session id, as a chat UI's would."""

    def __init__(self, url: str, model: str, o: LoadOptions) -> None:
        from qlift.loaders import iter_jsonl

        self.messages = [row["messages"] for _, row in iter_jsonl(o.prompts, comments=True)
                         if isinstance(row, dict) and "messages" in row]
        self.url, self.model, self.o = url.rstrip("/"), model, o
        self.status: Counter[int] = Counter()
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in range(o.concurrency)]

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=120)

    def _loop(self, k: int) -> None:
        import httpx

        rng = random.Random(k)
        with httpx.Client(timeout=120) as client:
            while not self.stop_event.is_set() and sum(self.status.values()) < self.o.max_requests:
                body = {"model": self.model, "messages": rng.choice(self.messages), "max_tokens": self.o.max_tokens,
                        "temperature": 0, "stream": True}
                try:
                    with client.stream("POST", f"{self.url}/v1/chat/completions", json=body,
                                       headers={"X-Session-Id": f"user-{rng.randrange(1000)}"}) as resp:
                        code = resp.status_code
                        for line in resp.iter_lines():  # to the end of the stream, as a chat UI reads it
                            if line.strip() == "data: [DONE]":
                                break
                            if line.startswith("data: {") and "error" in json.loads(line[6:]):
                                code = 599
                except httpx.HTTPError:
                    code = 0
                with self.lock:
                    self.status[code] += 1


def promote(spec_data: dict[str, Any], journal_path: Path, token: str | None) -> Any:
    """`qlift promote start` in this process, with the router's admin token in the environment."""
    from qlift.rollout import start
    from qlift.rollout.spec import RolloutSpec

    spec = RolloutSpec.model_validate(spec_data)
    old = os.environ.get("QLIFT_ROUTER_TOKEN")
    if token:
        os.environ["QLIFT_ROUTER_TOKEN"] = token
    try:
        return start(spec, journal_path, new=True)
    finally:
        if token:
            if old is None:
                os.environ.pop("QLIFT_ROUTER_TOKEN", None)
            else:
                os.environ["QLIFT_ROUTER_TOKEN"] = old
