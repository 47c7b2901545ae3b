"""A `qlift serve` running in the foreground, found by its address, and restarted on request.

`qlift serve` writes ``serve.json`` in its run directory: its own pid and the `qlift serve` argv that serves the
same model the same way (recipe, served name, host, port, --set, --lora, --lora-runtime), after the CPU pinning
it ran with as ``VAR=value`` items (``lora.PINNING_ENV``). A restart keeps that argv and that environment, swaps
the --lora list for the adapters the server serves now, stops the old `qlift serve` with
SIGTERM (it drains, then stops vLLM) and starts the new one detached, its output in the new run's log.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from qlift import httpclient
from qlift.errors import ExternalToolError
from qlift.fsutil import write_json_atomic
from qlift.settings import qlift_home
from qlift.vllm.process import pid_alive

if TYPE_CHECKING:
    from qlift.serve.launch import LaunchSpec

log = logging.getLogger(__name__)
RECORD = "serve.json"


def serve_argv(spec: LaunchSpec) -> list[str]:
    """The `qlift serve` argv that serves ``spec`` again (the port fixed, the recipe as resolved)."""
    from qlift.serve.lora import PINNING_ENV, serve_command

    opts = spec.options
    recipe = opts.recipe if Path(opts.recipe).is_file() else spec.recipe
    argv = serve_command(spec.model, dict(opts.loras), served_name=spec.served_model_name, recipe=recipe,
                         runtime=opts.lora_runtime, host=opts.host, port=spec.port, sets=list(opts.sets),
                         api_key_env=opts.api_key_env,
                         env={k: os.environ[k] for k in PINNING_ENV if os.environ.get(k)})
    if opts.replicas > 1:
        argv += ["--replicas", str(opts.replicas), "--router-policy", opts.router_policy]
    return argv


def write_record(spec: LaunchSpec, *, replicas: list[str] | None = None) -> None:
    """``replicas``: a pool's replica URLs (``spec`` is then its front: vllm-router's address)."""
    write_json_atomic(spec.run_dir / RECORD, {"pid": os.getpid(), "base_url": spec.base_url,
                                              "argv": serve_argv(spec), "device": spec.plan.device,
                                              "timeout_s": spec.options.timeout_s, "drain_s": spec.options.drain_s,
                                              "replicas": replicas or []})


@dataclass
class ServeRecord:
    """A running `qlift serve` (its pid alive) at an address."""

    run_dir: Path
    pid: int
    base_url: str
    argv: list[str]
    device: str = "cpu"  # the recipe's: cpu or gpu
    timeout_s: float = 900.0
    drain_s: float = 30.0
    replicas: list[str] = field(default_factory=list)  # a pool's: each replica's URL (base_url is vllm-router's)

    def is_pool_at(self, server: str) -> bool:
        """Is this a pool, and ``server`` its vllm-router (not one of its replicas)?"""
        return bool(self.replicas) and _address(self.base_url) == _address(server)

    def with_adapters(self, adapters: dict[str, str]) -> list[str]:
        """This server's argv with ``adapters`` (name -> dir) as its --lora list."""
        out: list[str] = []
        skip = False
        for arg in self.argv:
            if skip:
                skip = False
                continue
            if arg == "--lora":
                skip = True
                continue
            out.append(arg)
        at = out.index("--lora-runtime") if "--lora-runtime" in out else len(out)
        extra = [x for name, path in adapters.items() for x in ("--lora", f"{name}={path}")]
        return out[:at] + extra + out[at:]


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url.rstrip("/").removesuffix("/v1"))
    host = parts.hostname or ""
    return ("127.0.0.1" if host == "localhost" else host), parts.port or 80


def find(server: str) -> ServeRecord | None:
    """The running `qlift serve` at ``server`` (newest run first), or None: not started by qlift serve here. A
    pool's record is found by its vllm-router's address and by each replica's."""
    want = _address(server)
    runs = qlift_home() / "runs"
    records = sorted(runs.glob(f"serve-*/{RECORD}"), key=lambda p: p.stat().st_mtime, reverse=True) \
        if runs.is_dir() else []
    for path in records:
        try:
            data = json.loads(path.read_text())
            rec = ServeRecord(run_dir=path.parent, pid=int(data["pid"]), base_url=str(data["base_url"]),
                              argv=[str(a) for a in data["argv"]], device=str(data.get("device", "cpu")),
                              timeout_s=float(data.get("timeout_s", 900)),
                              drain_s=float(data.get("drain_s", 30)),
                              replicas=[str(u) for u in data.get("replicas") or []])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if want in {_address(u) for u in [rec.base_url, *rec.replicas]} and pid_alive(rec.pid):
            return rec
    return None


def _healthy(base_url: str) -> bool:
    try:
        return httpclient.get(base_url.rstrip("/") + "/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def restart(rec: ServeRecord, adapters: dict[str, str]) -> Path:
    """Stop ``rec``'s `qlift serve` and start it again with ``adapters``; returns the new one's log. Returns
    once /health answers; raises with the log's path when it dies or does not answer in time."""
    from qlift.serve.lora import command_line, split_env

    argv = rec.with_adapters(adapters)
    line = command_line(argv)
    log.warning("restarting the server at %s: %s", rec.base_url, line)
    os.kill(rec.pid, signal.SIGTERM)
    deadline = time.monotonic() + rec.drain_s + 120
    while pid_alive(rec.pid) or _healthy(rec.base_url):
        if time.monotonic() > deadline:
            raise ExternalToolError(f"the server at {rec.base_url} (qlift serve pid {rec.pid}) did not stop",
                                    hint=f"Stop it yourself, then run: {line}", tool="vllm")
        time.sleep(0.5)
    logs = qlift_home() / "runs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"restart-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    pinning, argv = split_env(argv)
    cmd = [sys.executable, "-m", "qlift", *argv[1:]] if argv[0] == "qlift" else argv
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **pinning}, start_new_session=True)
    deadline = time.monotonic() + rec.timeout_s
    while not _healthy(rec.base_url):
        if proc.poll() is not None or time.monotonic() > deadline:
            why = f"exited with {proc.returncode}" if proc.returncode is not None else "did not answer /health"
            raise ExternalToolError(f"the restarted server at {rec.base_url} {why}", hint=f"See {log_path}.",
                                    tool="vllm")
        time.sleep(1.0)
    log.warning("the server at %s is back (pid %d, log %s)", rec.base_url, proc.pid, log_path)
    return log_path
