"""What a fleet of qlift routers behind nginx costs and gives: the same chat load straight to a fake backend,
through one `qlift router`, and through nginx in front of one and of two routers, interleaved in one run.

Arms (one fake OpenAI backend process behind all of them: 8 streamed chunks, no model):
  direct        - the backend itself.
  router        - one `qlift router` (access log, metrics, the request log a rollout reads).
  nginx+1       - nginx (Debian's, round robin, proxy_next_upstream as docs/router.md's fleet) over that router.
  nginx+2       - the same nginx over two routers.

Reports p50 / p95 TTFB (the first content chunk of a streamed answer) at low concurrency, and requests/s of
short non-streamed answers at high concurrency, each arm in ABBA-ordered rounds so drift hits all alike.

    .venv/bin/python benchmarks/fleet.py [--rounds 2] [--ttfb-requests 200] [--rate-requests 1500] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

NGINX = "/usr/sbin/nginx"
CHUNKS = 8


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


# -- the fake backend (its own process: ``fleet.py --fake-backend PORT``) ------------------------------------------

def serve_fake(port: int) -> None:
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response({"id": "x", "object": "chat.completion", "model": "m", "choices": [{
                "index": 0, "message": {"role": "assistant", "content": "ok " * CHUNKS}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": CHUNKS, "total_tokens": 5 + CHUNKS}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(CHUNKS):
            chunk = {"id": "x", "object": "chat.completion.chunk", "model": "m",
                     "choices": [{"index": 0, "delta": {"content": "ok "},
                                  "finish_reason": "stop" if i == CHUNKS - 1 else None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# -- the parts -----------------------------------------------------------------------------------------------------

def _wait(url: str, proc: subprocess.Popen[Any], timeout_s: float = 30) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited ({proc.returncode})")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def _nginx(upstreams: list[str], d: Path, port: int) -> subprocess.Popen[bytes]:
    d.mkdir(parents=True, exist_ok=True)
    temps = "\n".join(f"    {k}_temp_path {d}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    servers = "\n".join(f"        server {u.removeprefix('http://')} max_fails=0;" for u in upstreams)
    (d / "nginx.conf").write_text(f"""
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log;
worker_processes 2;
events {{ worker_connections 1024; }}
http {{
    access_log off;
{temps}
    upstream routers {{
{servers}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://routers;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
        }}
    }}
}}
""")
    proc = subprocess.Popen([NGINX, "-p", str(d), "-c", str(d / "nginx.conf")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait(f"http://127.0.0.1:{port}/", proc)
    return proc


def _router(backend: str, d: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "qlift", "router", "--backend", f"stable={backend}#m",
                             "--public-model", "chat", "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=open(d / f"router-{port}.log", "wb"),  # noqa: SIM115
                            env={k: v for k, v in os.environ.items() if k != "QLIFT_ROUTER_TOKEN"})
    _wait(f"http://127.0.0.1:{port}/health", proc)
    return proc


# -- the load --------------------------------------------------------------------------------------------------------

async def _ttfb(url: str, n: int, concurrency: int) -> list[float]:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "stream": True}
    out: list[float] = []
    queue = list(range(n))

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            queue.pop()
            t0 = time.perf_counter()
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        out.append(time.perf_counter() - t0)
                        break
                async for _ in resp.content:
                    pass

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return out


async def _rate(url: str, n: int, concurrency: int) -> tuple[float, int]:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    queue, failed = list(range(n)), 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal failed
        while queue:
            queue.pop()
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                await resp.read()
                failed += resp.status != 200

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120),
                                     connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return n / (time.perf_counter() - t0), failed


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fake-backend", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ttfb-requests", type=int, default=200)
    ap.add_argument("--ttfb-concurrency", type=int, default=2)
    ap.add_argument("--rate-requests", type=int, default=1500)
    ap.add_argument("--rate-concurrency", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.fake_backend:
        serve_fake(args.fake_backend)
        return
    from qlift.vllm.process import free_port

    procs: list[subprocess.Popen[Any]] = []
    with tempfile.TemporaryDirectory(prefix="qlift-fleet-bench-") as tmp:
        d = Path(tmp)
        try:
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, __file__, "--fake-backend", str(port)]))
            backend = f"http://127.0.0.1:{port}"
            _wait(f"{backend}/health", procs[-1])
            routers = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
            for r in routers:
                procs.append(_router(backend, d, int(r.rsplit(":", 1)[1])))
            arms = {"direct": backend, "router": routers[0]}
            for name, ups in (("nginx+1", routers[:1]), ("nginx+2", routers)):
                p = free_port()
                procs.append(_nginx(ups, d / name, p))
                arms[name] = f"http://127.0.0.1:{p}"
            for url in arms.values():  # warm every part
                asyncio.run(_ttfb(url, 100, 4))
            ttfb: dict[str, list[float]] = {a: [] for a in arms}
            rate: dict[str, list[float]] = {a: [] for a in arms}
            failed = 0
            for k in range(args.rounds):
                order = list(arms) if k % 2 == 0 else list(reversed(arms))  # ABBA
                for a in order:
                    ttfb[a] += asyncio.run(_ttfb(arms[a], args.ttfb_requests, args.ttfb_concurrency))
                for a in order:
                    rps, bad = asyncio.run(_rate(arms[a], args.rate_requests, args.rate_concurrency))
                    rate[a].append(rps)
                    failed += bad
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    rows = {a: {"ttfb_p50_ms": round(_pct(ttfb[a], 50) * 1000, 2), "ttfb_p95_ms": round(_pct(ttfb[a], 95) * 1000, 2),
                "req_per_s": round(statistics.mean(rate[a]), 1)} for a in arms}
    out = {"cpu": cpu_name(), "cores": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 1), "failed": failed,
           "arms": rows, "args": {k: v for k, v in vars(args).items() if k != "fake_backend"}}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['cpu']}, {out['cores']} cores, load {out['load_1m']} (1 min) at the end; {failed} failed requests")
    print(f"{'arm':<10} {'TTFB p50 ms':>12} {'TTFB p95 ms':>12} {'req/s':>8}")
    for a, r in rows.items():
        print(f"{a:<10} {r['ttfb_p50_ms']:>12} {r['ttfb_p95_ms']:>12} {r['req_per_s']:>8}")
    base = rows["router"]
    print(f"nginx+2 / router: TTFB p50 {rows['nginx+2']['ttfb_p50_ms'] / base['ttfb_p50_ms']:.2f}x, "
          f"req/s {rows['nginx+2']['req_per_s'] / base['req_per_s']:.2f}x")


if __name__ == "__main__":
    main()
