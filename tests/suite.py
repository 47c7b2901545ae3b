"""`make test`: the whole suite in two parts that fit a 2-core machine, then the slowest tests and the total.

1. Every test that needs at most one core of vLLM, on one pytest-xdist worker per core (``--dist loadfile``:
   a file's module-scoped servers start once). tests/conftest.py binds each worker's vLLM servers to the
   worker's own core, so two servers never share one.
2. The ``pair`` tests (a stable and a canary server, one bound to each core, judged against each other) on
   their own: another worker beside them would make one core slower than the other.

Arguments are pytest's and go to both parts (a ``-m`` expression is combined with each part's own).
Each part's JUnit XML is kept in ``.cache/suite/``. Each part's CPU is sampled by process kind and test file
(tests/suite_profile.py) and printed before the total: what each suite costs on 2 cores, beside its wall time.
``QLIFT_TEST_WORKERS`` sets the workers of part 1 (default: the cores this process may use, at most 2).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from substrate import TEST_CACHE
from suite_profile import SuiteProfile

REPO = Path(__file__).resolve().parent.parent
SLOWEST = 15
COSTLIEST_FILES = 20


def cpu_line() -> str:
    from qlift.hardware import detect_cpu

    cpu = detect_cpu()
    return f"{cpu.model}, {len(os.sched_getaffinity(0))} cores, {cpu.vector_isa}"


def split_marker(args: list[str]) -> tuple[list[str], str | None]:
    """The arguments without ``-m EXPR`` / ``-mEXPR``, and EXPR."""
    rest, expr, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a == "-m" and i + 1 < len(args):
            expr, i = args[i + 1], i + 2
            continue
        if a.startswith("-m") and len(a) > 2 and not a.startswith("--"):
            expr = a[2:]
        else:
            rest.append(a)
        i += 1
    return rest, expr


def timings(junit: Path) -> list[tuple[float, str]]:
    if not junit.exists():
        return []
    out = []
    for case in ET.parse(junit).iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        out.append((float(case.get("time") or 0), name))
    return out


def by_file(rows: list[tuple[float, str]]) -> list[tuple[float, int, str]]:
    """(seconds, tests, file) for each test file, the costliest first: what each suite costs."""
    seconds: dict[str, float] = {}
    count: dict[str, int] = {}
    for t, name in rows:
        f = name.split("::", 1)[0]
        seconds[f] = seconds.get(f, 0.0) + t
        count[f] = count.get(f, 0) + 1
    return sorted(((t, count[f], f) for f, t in seconds.items()), reverse=True)


def start_builds(marker: str | None, logs: Path) -> list[tuple[str, subprocess.Popen[bytes], Path]]:
    """Build what a fresh clone lacks beside part 1's collection, in the tests' cache, each in a process of its own:
    SmolLM2 converted from the built-in GGUF (~25 s of one core, which every vLLM test waits on; the workers'
    fixture then finds it, or waits on its lock), and llm-compressor's tool environment (a pip install of ~30-100 s
    that otherwise held the first quantize test's worker; not for a run that leaves out the slow tests, as
    `make test-fast` does). Each says what it did at the end of the run."""
    jobs = [("SmolLM2 from the built-in GGUF", ["import-gguf", "--builtin", "smollm2"], "builtin.log")]
    if not (marker and "not slow" in marker):
        jobs.append(("llm-compressor's tool environment", ["env", "quantize", "--setup"], "tool-env.log"))
    started = []
    for title, args, name in jobs:
        with open(logs / name, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "qlift", *args], cwd=REPO, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "QLIFT_CACHE_DIR": str(TEST_CACHE / "qlift-cache")})
        started.append((title, proc, logs / name))
    return started


def build_line(title: str, proc: subprocess.Popen[bytes], log: Path) -> str:
    rc = proc.wait()
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    # `env --setup` says "created: PATH (N s)" or "ready (already built): ..." first, then the env's details
    said = next((ln for ln in lines if ln.startswith(("created", "ready"))), (lines or ["nothing"])[-1])
    return f"suite: {title}, beside part 1: exit {rc}: {said}"


def main(argv: list[str]) -> int:
    args, user_expr = split_marker(argv)
    workers = int(os.environ.get("QLIFT_TEST_WORKERS") or min(2, len(os.sched_getaffinity(0))))
    print(f"suite: {cpu_line()}; part 1 on {workers} workers, part 2 (pair) alone", flush=True)

    def expr(own: str) -> str:
        return f"({user_expr}) and {own}" if user_expr else own

    parts = [("part 1: all but pair", ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else [],
              expr("not pair")),
             ("part 2: pair", [], expr("pair"))]
    # pytest rewrites each test module's asserts and caches the result as a .pyc, unless PYTHONDONTWRITEBYTECODE is
    # set (CI and these machines set it): then every pytest process (each part's workers) rewrote all 134 test
    # modules again, ~11 s of CPU each here. The suite's processes may write caches (``__pycache__`` is git-ignored).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    codes, rows, walls, profiles = [], [], [], []
    keep = REPO / ".cache" / "suite"  # each part's JUnit XML stays here for a closer look (per test, per worker)
    keep.mkdir(parents=True, exist_ok=True)
    builds = start_builds(user_expr, keep)
    for i, (title, extra, marker) in enumerate(parts):
        junit = keep / f"part{i + 1}.xml"
        junit.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "pytest", *extra, "-m", marker, f"--junitxml={junit}", *args]
        print(f"\nsuite: {title}: {' '.join(cmd[1:])}", flush=True)
        for _, proc, _ in builds:
            proc.poll()  # reap a finished build: the profile would read an exited child's CPU as the next part's
        t0 = time.monotonic()
        with SuiteProfile(keep / "now") as profile:
            codes.append(subprocess.call(cmd, cwd=REPO, env={**env, "QLIFT_SUITE_TRACE": str(keep / "now")}))
        walls.append(time.monotonic() - t0)
        profiles.append(profile.report(title, int(os.environ.get("QLIFT_PROFILE_TOP", "20"))))
        rows += timings(junit)
    print()
    for build in builds:
        print(build_line(*build))
    print(f"\nsuite: the {SLOWEST} slowest tests (setup + call + teardown, s)")
    for seconds, name in sorted(rows, reverse=True)[:SLOWEST]:
        print(f"  {seconds:8.1f}  {name}")
    files = by_file(rows)
    print(f"\nsuite: what each test file costs (s summed over its tests; part 1's {workers} workers run side by "
          f"side), the {COSTLIEST_FILES} costliest of {len(files)}")
    for seconds, n, name in files[:COSTLIEST_FILES]:
        print(f"  {seconds:8.1f}  {n:4d} tests  {name}")
    for lines in profiles:
        print("\n" + "\n".join(lines))
    print(f"suite: {len(rows)} tests; part 1 {walls[0]:.0f} s, part 2 {walls[1]:.0f} s, total {sum(walls):.0f} s "
          f"({sum(walls) / 60:.1f} min) on {cpu_line()}")
    if all(c == 5 for c in codes):
        return 5  # no test collected in either part
    return next((c for c in codes if c not in (0, 5)), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
