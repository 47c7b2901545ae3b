"""qlift serve on a real GPU: the planner's KV estimate against vLLM's own, and throughput.

Builds a Qwen2.5-7B-shaped model directory (config, Qwen-sized tokenizer, header-only
safetensors for the planner), runs `qlift plan` and `qlift serve --recipe R --set
load_format=dummy`, reads vLLM's "GPU KV cache size" from its log, sends a bounded
streamed load to 127.0.0.1 and prints output tok/s, then stops the server with SIGINT.

    python benchmarks/serve_gpu.py --recipe chat-h200 --requests 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))

from build_model import build_model  # noqa: E402


async def load(base: str, model: str, n: int, concurrency: int, out_tokens: int) -> tuple[float, int]:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    total = 0

    async def one(i: int, client: httpx.AsyncClient) -> None:
        nonlocal total
        async with sem:
            r = await client.post(f"{base}/completions", json={
                "model": model, "prompt": [((i * 7919 + j) % 150000) for j in range(256)],
                "max_tokens": out_tokens, "ignore_eos": True, "temperature": 0})
            r.raise_for_status()
            total += r.json()["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(one(i, client) for i in range(n)))
    return time.perf_counter() - t0, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="chat-h200")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    a = ap.parse_args()
    root = build_model(Path(tempfile.mkdtemp(prefix="qwen7b-shape-")))
    qlift = [sys.executable, "-m", "qlift"]
    sets = [x for s in ["load_format=dummy", *a.sets] for x in ("--set", s)]
    plan = json.loads(subprocess.run([*qlift, "plan", str(root), "--recipe", a.recipe, *sets, "--json"],
                                     check=True, capture_output=True, text=True).stdout)
    print(f"plan: kv {plan['kv_cache_bytes'] / 2**30:.1f} GiB = {plan['kv_capacity_tokens']:,} tokens, "
          f"weights {plan['weight_bytes'] / 2**30:.1f} GiB, verdict {plan['verdict']}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen([*qlift, "serve", str(root), "--recipe", a.recipe, *sets, "--served-model-name", "m",
                             "--port", "8011", "--json"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    print(f"ready after {time.monotonic() - t0:.0f} s: {ready}", flush=True)
    try:
        wall, toks = asyncio.run(load("http://127.0.0.1:8011/v1", "m", a.requests, a.concurrency, a.max_tokens))
        print(f"load: {a.requests} requests x 256 in / {a.max_tokens} out, concurrency {a.concurrency}: "
              f"{toks / wall:,.0f} output tok/s ({wall:.1f} s)", flush=True)
    finally:
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    runs = sorted((Path(os.environ.get("QLIFT_HOME", Path.home() / ".cache/qlift")) / "runs").glob("serve-*"))
    log = (runs[-1] / "vllm.log").read_text(errors="replace") if runs else ""
    for pat in (r"Available KV cache memory: [\d.]+ GiB", r"KV cache size: [\d,]+ tokens",
                r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x"):
        m = re.search(pat, log)
        print(f"vllm: {m.group(0) if m else pat + ' (not found)'}")
    m = re.search(r"KV cache size: ([\d,]+) tokens", log)  # 0.26: "GPU ...", 0.32: "<device> ..."
    if m:
        vllm_tokens = int(m.group(1).replace(",", ""))
        print(f"planner / vLLM KV tokens: {plan['kv_capacity_tokens'] / vllm_tokens:.3f}x")
    print(f"qlift serve exited {proc.returncode}")


if __name__ == "__main__":
    main()
