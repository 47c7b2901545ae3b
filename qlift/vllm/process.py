"""Process pieces shared by vLLM servers and workers: a free port, dying with the parent, the cause in a log."""

from __future__ import annotations

import os
import random
import re
import resource
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

# Exception lines in vLLM logs that only wrap the real cause printed above them.
_WRAPPER_ERRORS = (
    "Engine core initialization failed",
    "EngineCore failed to start",
    "subprocess.CalledProcessError",
    "Traceback (most recent call last)",
    "initialization failed",
    "See stack trace for root cause",
    "See root cause above",
)
_ERROR_LINE = re.compile(
    r"^\s*(?:\([\w-]+ pid=\d+\)\s*)?"  # (EngineCore pid=12), (VllmWorker-0 pid=7) from a child
    r"(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\]\s*)?"  # vLLM's "ERROR 11-29 19:01:12 [file.py:953]"
    r"([\w.]*(?:Error|Exception)): (.+)$"
)
_PYDANTIC_HEADER = re.compile(r"^\d+ validation errors? for \w+$")
_MAX_CAUSE = 300


FREE_PORT_LOW = 20000  # free ports are drawn from here up to the ephemeral range


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a server about to start. Drawn at random below the kernel's ephemeral range:
    a port the kernel hands out for ``bind(0)`` comes from the range it also gives outgoing connections, so a busy
    process's next connection could take it before the server binds (seen as "address already in use" with three
    test workers making connections)."""
    high = _ephemeral_low()
    if high - FREE_PORT_LOW >= 1000:
        for port in random.sample(range(FREE_PORT_LOW, high), 64):
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists (ours or another user's) and is not a zombie (exited, not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def first_error_line(log_text: str) -> str | None:
    """The first exception line in a vLLM log that states a root cause (at most ~300 characters)."""
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        m = _ERROR_LINE.match(line)
        if m and not any(w in line for w in _WRAPPER_ERRORS):
            cause = m.group(2).strip()
            if _PYDANTIC_HEADER.match(cause):  # pydantic puts the reason on the next line
                detail = next((ln.strip() for ln in lines[i + 1:i + 3] if ln.strip()), "")
                cause = f"{cause}: {detail.removeprefix('Value error, ')}"
            if len(cause) > _MAX_CAUSE:
                cause = cause[:_MAX_CAUSE].rstrip() + " ..."
            return f"{m.group(1)}: {cause}"
    return None


def bound_cores(omp_threads_bind: str | None) -> set[int] | None:
    """The cores a ``VLLM_CPU_OMP_THREADS_BIND`` value names ("1", "0-3", "0,1|2,3"); None for auto/nobind."""
    value = (omp_threads_bind or "").strip()
    if value in ("", "auto", "nobind", "all"):
        return None
    cores: set[int] = set()
    try:
        for part in re.split(r"[|,]", value):
            lo, _, hi = part.strip().partition("-")
            cores.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return None  # vLLM reports a malformed value itself
    return cores or None


def child_setup(*, cores: set[int] | None, die_with_parent: bool) -> Callable[[], None] | None:
    """A ``preexec_fn`` that binds the whole child (and what it spawns) to ``cores``.

    vLLM's CPU bind pins only the model worker's threads: its API server and engine-core
    process (a busy scheduler loop) float onto the other servers' cores, so on a small host a
    server's front end slows its neighbour, and a canary on its own core reads slower than it is.
    """
    if cores is None and not die_with_parent:
        return None

    def setup() -> None:
        if cores is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)
        if die_with_parent:
            term_on_parent_death()

    return setup


def term_on_parent_death() -> None:
    """A ``preexec_fn``: on Linux, SIGTERM this child when the process that started it dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def qlift_importable(python: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` with this qlift importable by ``python`` when that is another interpreter (QLIFT_VLLM_PYTHON)."""
    if python != sys.executable:
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def raise_open_files_limit() -> str | None:
    """Raise this process's soft open-files limit to the hard one (children inherit it).

    vLLM's API server holds a socket per client; at a low soft limit it warns it could not raise
    it. Returns a line for the user when the limit was raised or could not be, None when it was
    already at the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or (hard == resource.RLIM_INFINITY and soft >= 1 << 20):
        return None
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        return f"could not raise the open-files limit from {soft} (hard limit {hard}): {exc}"
    return f"open-files limit raised from {soft} to {target} (the hard limit)"
