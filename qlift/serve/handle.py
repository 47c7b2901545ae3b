"""A started vLLM server as a handle: its log, stop and wait.

``ServeHandle.create`` writes the launch's run directory; ``launch`` starts vLLM and waits for /health.
``qlift serve`` (``qlift.serve.foreground.run``) holds one in the foreground until a signal; ``qlift.serve.start``
returns one to a caller that keeps the server in the background (``qlift release``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qlift.errors import ExternalToolError
from qlift.fsutil import write_json_atomic
from qlift.serialize import to_jsonable
from qlift.vllm.logview import LogFollower, LogView, StartupPhases
from qlift.vllm.process import first_error_line

if TYPE_CHECKING:
    from qlift.serve.launch import LaunchSpec
    from qlift.vllm.server import VllmServer


@dataclass
class ServeHandle:
    spec: LaunchSpec
    server: VllmServer
    view: LogView
    follow: LogFollower
    ready: bool = False

    @classmethod
    def create(cls, spec: LaunchSpec, *, view: LogView | None = None, keep: bool = False) -> ServeHandle:
        """Write the run directory (config, plan, model.json) and the server to start; ``keep``: the server
        outlives the process that starts it (else it is stopped when that process dies, even by SIGKILL)."""
        from qlift.serve.launch import API_KEY_VAR, config_server

        spec.run_dir.mkdir(parents=True, exist_ok=False)
        (spec.run_dir / "config.yaml").write_text(spec.config_yaml)
        write_json_atomic(spec.run_dir / "plan.json", to_jsonable(spec.plan))
        if spec.model_ref is not None:
            write_json_atomic(spec.run_dir / "model.json", to_jsonable(spec.model_ref))
        env = dict(spec.env)
        if spec.api_key_env:
            env[API_KEY_VAR] = os.environ[spec.api_key_env]
        server = config_server(spec.model, spec.run_dir, spec.options, spec.engine_args, env)
        server.die_with_parent = not keep
        return cls(spec, server, view or LogView(), LogFollower(server.log_path))

    @property
    def pid(self) -> int:
        return self.server.proc.pid if self.server.proc is not None else 0

    @property
    def base_url(self) -> str:
        """The OpenAI API's URL (``.../v1``)."""
        return f"{self.spec.base_url}/v1"

    def launch(self, on_poll: Callable[[], None] | None = None,
               on_started: Callable[[int], None] | None = None) -> ServeHandle:
        """Start vLLM and wait for /health (within the options' --timeout), its startup log through the view;
        ``on_started`` gets vLLM's pid before the wait, ``on_poll`` runs at each poll (to raise on a signal)."""
        view = self.view
        phases = StartupPhases(view.on_phase) if view.on_phase else None
        if self.server.proc is None:
            self.begin(on_started)

        def startup_poll() -> None:
            if on_poll is not None:
                on_poll()
            for line in self.follow.lines():
                view.startup_line(phases, line)

        self.server.wait_ready(timeout=self.spec.options.timeout_s, on_poll=startup_poll)
        self.ready = True
        for line in self.follow.lines():  # the last startup lines: the route list, uvicorn's start
            view.startup_line(phases, line)
        return self

    def begin(self, on_started: Callable[[int], None] | None = None) -> None:
        """Start vLLM without waiting (``launch`` then waits; a pool starts all its replicas first)."""
        self.server.start()
        (self.spec.run_dir / "server.pid").write_text(str(self.pid))
        if on_started is not None:
            on_started(self.pid)

    def running(self) -> bool:
        return self.server.proc is not None and self.server.proc.poll() is None

    def wait(self, on_poll: Callable[[], None] | None = None) -> None:
        """Stream the log through the view until vLLM exits, then raise what killed it."""
        while self.running():
            if on_poll is not None:
                on_poll()
            self.flush_log()
            time.sleep(0.5)
        self.flush_log()
        proc = self.server.proc
        cause = first_error_line(self.server.log_text()) or f"exit code {proc.returncode if proc else '?'}"
        raise ExternalToolError(f"vLLM exited: {cause}", hint=f"Full log: {self.server.log_path}", tool="vllm")

    def flush_log(self) -> None:
        for line in self.follow.lines():
            self.view.line(line)

    def stop(self, drain_s: float = 0) -> float:
        """Stop vLLM's process group (first letting in-flight requests finish for up to ``drain_s``); seconds."""
        began = time.monotonic()
        self.server.stop(drain_s=drain_s)
        return time.monotonic() - began
