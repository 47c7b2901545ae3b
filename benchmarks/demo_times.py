"""`make demo`'s stage times from a clean start, with the CPU named: the figures the README quotes (issue 56).

Runs ``examples/demo.py`` (the release file examples/release.yaml, then its summary) into a new ``--out``
directory with a new ``QLIFT_HOME`` (nothing cached: every stage runs), then prints each stage's wall time, the
total, and the CPU (model, usable cores, vector ISA, bf16 units). ``--emulate-avx2`` runs it as `.ci/run` does
with ``QLIFT_EMULATE_AVX2=1`` (torch, oneDNN, vLLM's kernel library and qlift's own checks see AVX2 only, so the
demo takes the AVX2 path: no W4A16 kernel, float32); an emulated time underestimates a real AVX2 machine.

    .venv/bin/python benchmarks/demo_times.py [--emulate-avx2] [--json FILE] [--keep DIR]

The demo's own output goes to DIR/demo.log; the stages (name, seconds, result) to DIR/stages.json. Bounded:
--budget seconds (default 40 minutes), after which the demo is stopped (SIGINT: it stops what it started).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cpu_text(emulated: bool) -> str:
    from qlift.hardware import detect_cpu

    cpu = detect_cpu()
    cores = len(os.sched_getaffinity(0))
    if emulated:
        return f"{cpu.model}, {cores} cores, AVX2 only (EMULATED on {cpu.vector_isa}; underestimates a real AVX2 CPU)"
    return f"{cpu.model}, {cores} cores, {cpu.vector_isa}"


def run_demo(work: Path, *, emulate_avx2: bool, budget_s: float) -> tuple[int, float]:
    """Run the demo once into ``work``/out with ``work``/home as QLIFT_HOME; (exit code, wall seconds)."""
    env = {**os.environ, "QLIFT_HOME": str(work / "home")}
    if emulate_avx2:
        env["QLIFT_EMULATE_AVX2"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / ".ci" / "avx2"), env.get("PYTHONPATH")) if p)
    argv = [sys.executable, str(REPO / "examples" / "demo.py"), "--out", str(work / "out"),
            "--json", str(work / "stages.json")]
    t0 = time.monotonic()
    with open(work / "demo.log", "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            rc = proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # the demo stops every process it started, then writes its stages
            try:
                rc = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
    return rc, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--emulate-avx2", action="store_true", help="the AVX2 path on this CPU (QLIFT_EMULATE_AVX2=1)")
    ap.add_argument("--keep", type=Path, help="work here (must not exist) instead of a temporary directory")
    ap.add_argument("--budget", type=float, default=2400, help="seconds before the demo is stopped")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")
    args = ap.parse_args()
    if args.keep is not None and args.keep.exists():
        print(f"error: {args.keep} exists: the demo must start clean (give a new directory)", file=sys.stderr)
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="qlift-demo-times-"))
    work.mkdir(parents=True, exist_ok=True)
    cpu = cpu_text(args.emulate_avx2)
    print(f"demo: {cpu}; work in {work} (log: demo.log)", flush=True)
    rc, wall = run_demo(work, emulate_avx2=args.emulate_avx2, budget_s=args.budget)
    stages_file = work / "stages.json"
    stages = json.loads(stages_file.read_text())["stages"] if stages_file.is_file() else []
    print(f"\n{'stage':<28} {'seconds':>8}  result")
    for s in stages:
        print(f"{s['name'][:28]:<28} {s['seconds']:8.1f}  {s['result'][:70]}")
    print(f"\ndemo: exit {rc}, {wall / 60:.1f} min after setup (stages {sum(s['seconds'] for s in stages) / 60:.1f} "
          f"min) on {cpu}")
    if args.json:
        from qlift.fsutil import write_json_atomic

        write_json_atomic(args.json, {"cpu": cpu, "exit": rc, "wall_s": round(wall, 1), "stages": stages,
                                      "command": " ".join(sys.argv)})
    return rc


if __name__ == "__main__":
    sys.exit(main())
