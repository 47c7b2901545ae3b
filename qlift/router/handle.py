"""A router in a process of its own: ``start(inputs, options) -> RouterHandle`` (ready info, stop, wait).

The process runs the stage's own ``run`` (``python -m qlift.router.handle``, the config as JSON on stdin, the
admin token in its environment, never in argv) and prints one JSON ready line. A process, not a thread, so a
caller such as ``qlift release`` can journal its pid, leave it running past its own exit, and keep its event
loop off the caller's interpreter.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlift.errors import ExternalToolError

if TYPE_CHECKING:
    from qlift.router.config import RouterConfig
    from qlift.router.run import RouterInputs

TOKEN_VAR = "QLIFT_ROUTER_TOKEN"


@dataclass
class RouterHandle:
    proc: subprocess.Popen[str]
    ready: dict[str, Any]  # the ready line: url, pid, public_model
    log_path: Path | None

    @property
    def url(self) -> str:
        return str(self.ready["url"]).rstrip("/")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        """Block until the router exits; its exit code."""
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (the router drains in-flight requests), then SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start(inputs: RouterInputs, options: RouterConfig, *, log_path: Path | None = None,
          on_started: Callable[[int], None] | None = None) -> RouterHandle:
    """Start the router in its own process (its stderr to ``log_path``) and return once it is ready;
    ``on_started``: its pid, before the wait (to journal it)."""
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
    if inputs.admin_token:
        env[TOKEN_VAR] = inputs.admin_token
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    err = open(log_path, "w") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True, env=env, start_new_session=True)
    finally:
        if log_path is not None:
            err.close()  # type: ignore[union-attr]
    if on_started is not None:
        on_started(proc.pid)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(options.model_dump_json())
        proc.stdin.close()
        line = proc.stdout.readline()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if not line:
        code = proc.wait()
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path is not None else []
        raise ExternalToolError(f"the router exited with code {code}: {' '.join(tail)}",
                                hint=f"See {log_path}." if log_path else "Run `qlift router` to see why.",
                                tool="router")
    return RouterHandle(proc, json.loads(line), log_path)


def _main() -> None:
    """The router's process: the config from stdin, the ready line on stdout, logs and errors on stderr."""
    from qlift.errors import QliftError, exit_code_for
    from qlift.router.config import RouterConfig
    from qlift.router.run import RouterInputs, run
    from qlift.settings import router_token

    logger = logging.getLogger("qlift")
    logger.addHandler(logging.StreamHandler(sys.stderr))
    logger.setLevel(logging.INFO)
    logger.propagate = False

    def ready(router: Any) -> None:
        print(json.dumps({"url": router.url, "pid": os.getpid(), "public_model": router.public_model}), flush=True)

    try:
        run(RouterInputs(router_token()), RouterConfig.model_validate_json(sys.stdin.read()), on_ready=ready)
    except QliftError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exit_code_for(exc))


if __name__ == "__main__":
    _main()
