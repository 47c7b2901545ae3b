"""Step (c) of docs/gpu.md: the tuned recipe with FP8 weights and FP8 KV cache against `vllm serve`
of the bf16 model with vLLM's defaults, in one run, each loaded by `qlift bench` (same requests).

Servers, one at a time, in this order (the first two are the figure that matters):
  vllm-defaults    python3 -m vllm.entrypoints.openai.api_server --model M --load-format dummy
  tuned-fp8-fp8kv  qlift serve M --recipe R --set quantization=fp8 --set kv_cache_dtype=fp8
  tuned-bf16       qlift serve M --recipe R
  tuned-fp8        qlift serve M --recipe R --set quantization=fp8
(every one with load_format=dummy: random weights; quantization=fp8 is vLLM's dynamic FP8 of the
bf16 checkpoint). A server is skipped when fewer than --reserve-s seconds of --deadline-s are left.
Writes bench-NAME.json (qlift bench, ratios against vllm-defaults inside), pipeline.json and
server-lines.txt (the servers' key log lines; whole logs stay in --logs).

    python3 benchmarks/gpu/fp8_vs_defaults.py /tmp/qwen7b-shape --recipe chat-h200
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from qlift.vllm.process import term_on_parent_death  # noqa: E402

SERVERS: list[tuple[str, list[str] | None]] = [  # name, --set values for qlift serve (None: plain vLLM)
    ("vllm-defaults", None),
    ("tuned-fp8-fp8kv", ["quantization=fp8", "kv_cache_dtype=fp8"]),
    ("tuned-bf16", []),
    ("tuned-fp8", ["quantization=fp8"]),
]


def start(name: str, sets: list[str] | None, a: argparse.Namespace, port: int, out: Path) -> subprocess.Popen[str]:
    log = open(a.logs / f"server-{name}.log", "w")  # noqa: SIM115  (lives as long as the server)
    if sets is None:
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(a.model),
                "--load-format", "dummy", "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port),
                *a.vllm_arg]
    else:
        argv = [sys.executable, "-m", "qlift", "serve", str(a.model), "--recipe", a.recipe, "--served-model-name",
                "m", "--port", str(port), *(x for s in ["load_format=dummy", *sets] for x in ("--set", s))]
    print(f"{name}: {' '.join(argv)}", flush=True)
    # Its own session (stopped as a group), and SIGTERM when this script dies: a device call cut at its
    # limit kills this script, and a server left behind would hold the GPU's memory for the next call.
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=term_on_parent_death)


def wait_ready(proc: subprocess.Popen[str], port: int, timeout: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"not ready after {timeout:.0f} s")


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGINT to the group (qlift serve stops vLLM's own group), SIGKILL what is left after 60 s."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def bench(name: str, a: argparse.Namespace, port: int, out: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "qlift", "bench", "--endpoint", f"http://127.0.0.1:{port}", "--model", "m",
            "--tokenizer", str(a.model), "--concurrency", str(a.concurrency), "--requests", str(a.requests),
            "--input-tokens", "256", "--output-tokens", "256", "-o", str(out / f"bench-{name}.json"), "--json"]
    base = out / "bench-vllm-defaults.json"
    if name != "vllm-defaults" and base.is_file():
        argv += ["--baseline", str(base)]
    print(f"{name}: {' '.join(argv)}", flush=True)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / f"bench-{name}.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--recipe", default="chat-h200", help="Name or file (a file's name must be the recipe's name).")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--only", help="Comma-separated server names (default: all, in order).")
    ap.add_argument("--vllm-arg", action="append", default=[], help="Extra argv for the plain vLLM server.")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--deadline-s", type=float, default=560)
    ap.add_argument("--reserve-s", type=float, default=110, help="Seconds one server and its bench need.")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/qlift-gpu-out")))
    ap.add_argument("--logs", type=Path, default=Path("/tmp/qlift-gpu-logs"), help="Server logs (key lines: --out).")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    a.logs.mkdir(parents=True, exist_ok=True)
    only = set(a.only.split(",")) if a.only else None
    t0, rows = time.monotonic(), []
    for i, (name, sets) in enumerate(SERVERS):
        if only is not None and name not in only:
            continue
        if time.monotonic() - t0 > a.deadline_s - a.reserve_s:
            rows.append({"server": name, "status": "skipped", "reason": "device-time deadline"})
            print(f"{name}: skipped (deadline)", flush=True)
            continue
        port = 8100 + i
        ts = time.monotonic()
        proc = start(name, sets, a, port, a.out)
        try:
            wait_ready(proc, port, a.start_timeout)
            ready_s = time.monotonic() - ts
            level = bench(name, a, port, a.out)["levels"][0]
            row = {"server": name, "sets": sets, "status": "measured", "ready_s": round(ready_s, 1),
                   "output_tokens_per_s": level["output_tokens_per_s"], "requests_per_s": level["requests_per_s"],
                   "completed": level["completed"], "failed": level["failed"],
                   "p50_tpot_ms": level["latency_ms"]["tpot"]["p50"], "p99_ttft_ms": level["latency_ms"]["ttft"]["p99"]}
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            row = {"server": name, "sets": sets, "status": "failed", "reason": str(exc)}
        finally:
            stop(proc)
        rows.append(row)
        print(f"{name}: {json.dumps(row)}", flush=True)
    base = next((r for r in rows if r["server"] == "vllm-defaults" and r["status"] == "measured"), None)
    for r in rows:
        if base and r["status"] == "measured":
            r["ratio_vs_vllm_defaults"] = round(r["output_tokens_per_s"] / base["output_tokens_per_s"], 3)
    summary = {"model": str(a.model), "recipe": a.recipe, "requests": a.requests, "concurrency": a.concurrency,
               "input_tokens": 256, "output_tokens": 256, "servers": rows}
    (a.out / "pipeline.json").write_text(json.dumps(summary, indent=2))
    key = re.compile(r"KV cache|quantiz|fp8|Asynchronous scheduling|CUDA graph|took [0-9.]+ s|Error|error")
    with open(a.out / "server-lines.txt", "w") as fh:
        for log in sorted(a.logs.glob("server-*.log")):
            lines = log.read_text(errors="replace").splitlines(keepends=True)
            fh.writelines(f"{log.name}: {line}" for line in lines if key.search(line))
    print(f"{'server':18} {'output tok/s':>13} {'ratio':>6} {'p50 TPOT ms':>12} {'p99 TTFT ms':>12}")
    for r in rows:
        if r["status"] == "measured":
            print(f"{r['server']:18} {r['output_tokens_per_s']:13,.0f} {r.get('ratio_vs_vllm_defaults', 0):6.3f} "
                  f"{r['p50_tpot_ms']:12.1f} {r['p99_ttft_ms']:12.0f}")
        else:
            print(f"{r['server']:18} {r['status']}: {r.get('reason')}")


if __name__ == "__main__":
    main()
