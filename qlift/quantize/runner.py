"""Run the quantize worker in the tool environment and read its JSON-lines protocol."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qlift import errors
from qlift.errors import ExternalToolError, QliftError
from qlift.settings import qlift_home
from qlift.toolenv import tool_environ

log = logging.getLogger(__name__)

WORKER_MODULE = "qlift.quantize.worker"


def _log_path() -> Path:
    logs = qlift_home() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="quantize-", suffix=".log", dir=logs)
    os.close(fd)
    return Path(name)


def run_worker(
    python: Path,
    job: dict[str, Any],
    *,
    env: dict[str, str] | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    echo_log: bool = False,
) -> tuple[dict[str, Any], Path]:
    """Run one job; return the worker's result event and the path of its log.

    A ``qlift_error`` event is raised again as that qlift error class; any other failure
    becomes an ExternalToolError carrying the worker's last error line.
    """
    log_path = _log_path()
    with tempfile.TemporaryDirectory(prefix="qlift-quantize-job-") as tmp:
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        argv = [str(python), "-m", WORKER_MODULE, str(job_path)]
        log.debug("running: %s", " ".join(argv))
        result: dict[str, Any] | None = None
        error: dict[str, Any] | None = None
        with open(log_path, "wb") as logf:
            stderr = None if echo_log else logf
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                env=tool_environ() | (env or {}),
            )
            assert proc.stdout is not None
            try:
                for raw in proc.stdout:
                    event = _parse(raw)
                    if event is None:
                        continue
                    kind = event.get("event")
                    if kind == "progress" and on_progress:
                        on_progress(event)
                    elif kind == "result":
                        result = event
                    elif kind == "error":
                        error = event
                code = proc.wait()
            except BaseException:  # Ctrl-C or a crash here: do not leave the worker running
                proc.kill()
                proc.wait()
                raise
    if error is not None or code != 0 or result is None:
        raise _worker_error(error, code, log_path)
    return result, log_path


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        sys.stderr.write(raw.decode("utf-8", "replace"))
        return None
    return event if isinstance(event, dict) else None


def _worker_error(error: dict[str, Any] | None, code: int, log_path: Path) -> QliftError:
    if error and error.get("qlift_error"):
        cls = getattr(errors, str(error["qlift_error"]), QliftError)
        if isinstance(cls, type) and issubclass(cls, QliftError):
            try:
                return cls(str(error.get("message")), hint=error.get("hint"))
            except TypeError:  # subclasses with other signatures
                pass
        return QliftError(str(error.get("message")), hint=error.get("hint"))
    if error:
        line = f"{error.get('type')}: {error.get('message')}"
    else:
        line = _last_error_line(log_path) or f"exit code {code}"
    return ExternalToolError(
        f"llm-compressor failed: {line}",
        hint=f"Full log: {log_path}. If the tool environment is broken, run `qlift env quantize --setup`.",
        tool="llm-compressor",
    )


def _last_error_line(log_path: Path) -> str | None:
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        text = line.strip()
        if text and ("Error" in text or "error" in text or "Killed" in text):
            return text[:300]
    return None
