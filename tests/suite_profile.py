"""Where a suite part's CPU goes: every process below tests/suite.py sampled from /proc, by kind and by test file.

Wall seconds per test (the JUnit times) hide what matters on 2 cores: a test that waits on real-time windows
costs wall but leaves its core idle, and a vLLM server a fixture started keeps burning CPU for every test of its
file. Each tick reads each descendant's utime + stime; the delta goes to the process's kind (by its command line)
and to the test file running then on the pytest process it descends from (conftest.py writes each worker's
current test to ``QLIFT_SUITE_TRACE``). A process's last tick before it exits is lost, so the totals are a floor.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from pathlib import Path

TICK_S = 0.5
HZ = os.sysconf("SC_CLK_TCK")
# each kind of process, and its column's header
KINDS = {"vLLM engine core": "engine", "vLLM API server": "api", "pytest (in process)": "pytest",
         "qlift router": "router", "qlift (other)": "qlift", "Ray": "ray", "nginx/prometheus": "nginx+p",
         "other": "other"}


def kind_of(cmdline: str, comm: str) -> str:
    if comm.startswith("VLLM::") and "APIServer" not in comm:  # EngineCore (cut to 15), Worker
        return "vLLM engine core"
    if any(m in cmdline for m in ("qlift.vllm.cli_main", "vllm.entrypoints", "APIServer")) or "APIServer" in comm:
        return "vLLM API server"
    if "-m qlift router" in cmdline:
        return "qlift router"
    if "-m qlift" in cmdline:
        return "qlift (other)"
    if "/ray/" in cmdline or comm.startswith(("raylet", "gcs_server", "ray::")):
        return "Ray"
    if comm in ("nginx", "prometheus", "promtool"):
        return "nginx/prometheus"
    return "other"


def _stat(pid: str) -> tuple[str, int, int] | None:
    """(comm, ppid, utime + stime in ticks) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm, rest = raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()
    return comm, int(rest[1]), int(rest[11]) + int(rest[12])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class SuiteProfile:
    """Samples while running (a daemon thread); ``report()`` gives the lines to print after the part."""

    def __init__(self, trace_dir: Path) -> None:
        self.trace_dir, self.root = trace_dir, os.getpid()
        self.by_kind: dict[str, float] = defaultdict(float)
        self.by_file: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.timeline: list[tuple[float, float]] = []  # (seconds since the start, CPU seconds in that tick)
        self._seen: dict[int, tuple[str, int]] = {}  # pid -> (kind, ticks at the last sample)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.wall = 0.0

    def __enter__(self) -> SuiteProfile:
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        for f in self.trace_dir.iterdir():
            f.unlink()
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.wall = time.monotonic() - self._t0

    def _current_tests(self) -> dict[int, str]:
        """pytest process pid -> the test file it runs now."""
        out = {}
        for f in self.trace_dir.iterdir():
            try:
                pid, nodeid = f.read_text().split("\t", 1)
                out[int(pid)] = nodeid.split("::", 1)[0]
            except (OSError, ValueError):
                continue
        return out

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            self.sample()

    def sample(self) -> None:
        stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(p)) is not None}
        tests = self._current_tests()
        tick = 0.0
        for pid, (comm, ppid, ticks) in stats.items():
            chain, p = [], pid
            while p in stats and p != self.root and p > 1 and len(chain) < 64:
                chain.append(p)
                p = stats[p][1]
            if p != self.root:
                continue  # not below this suite
            owner = next((c for c in chain if c in tests), None)
            kind, before = self._seen.get(pid, ("other", 0))  # a process born since the last tick counts whole
            if kind == "other":  # again each tick: a spawned child takes its title (vLLM's engine core) later
                cmdline = _cmdline(pid)
                kind = kind_of(cmdline, comm)
                if "spawn_main" in cmdline and self._seen.get(ppid, ("",))[0] == "vLLM API server":
                    kind = "vLLM engine core"  # importing torch and vLLM before it names itself
            kind = "pytest (in process)" if pid in tests else kind  # a worker is known once it starts a test
            if ticks <= before:
                continue
            self._seen[pid] = (kind, ticks)
            seconds = (ticks - before) / HZ
            self.by_kind[kind] += seconds
            tick += seconds
            self.by_file[tests[owner] if owner else "(pytest start-up)"][kind] += seconds
        self.timeline.append((time.monotonic() - self._t0, tick))

    def report(self, title: str, top: int = 20) -> list[str]:
        total = sum(self.by_kind.values())
        cores = len(os.sched_getaffinity(0))
        lines = [f"suite: {title}: {total:.0f} core-s of CPU in {self.wall:.0f} s on {cores} cores "
                 f"({100 * total / max(1e-9, self.wall * cores):.0f}% busy; sampled every {TICK_S} s, a floor)",
                 "  " + ", ".join(f"{k} {self.by_kind[k]:.0f}" for k in KINDS if self.by_kind.get(k))]
        tenths = [0.0] * 10
        for at, cpu in self.timeline:
            tenths[min(9, int(10 * at / max(1e-9, self.wall)))] += cpu
        lines.append("  busy in each tenth of the part (%): "
                     + " ".join(f"{100 * c / max(1e-9, self.wall / 10 * cores):.0f}" for c in tenths))
        files = sorted(self.by_file.items(), key=lambda kv: -sum(kv[1].values()))[:top]
        lines.append(f"  {'core-s':>7}  " + " ".join(f"{h:>7}" for h in KINDS.values()) + "  test file")
        for name, kinds in files:
            lines.append(f"  {sum(kinds.values()):7.0f}  " + " ".join(f"{kinds.get(k, 0):7.0f}" for k in KINDS)
                         + f"  {name}")
        return lines
