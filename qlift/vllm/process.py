"""Process pieces shared by vLLM servers and workers: a free port, dying with the parent, the cause in a log."""

from __future__ import annotations

import re
import signal
import socket
import sys

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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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


def term_on_parent_death() -> None:
    """A ``preexec_fn``: on Linux, SIGTERM this child when the process that started it dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
