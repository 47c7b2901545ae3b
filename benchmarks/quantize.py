"""qlift quantize: AWQ wall time and peak RSS; FP8 through qlift vs llm-compressor directly.

    .venv/bin/python benchmarks/quantize.py                      # SmolLM2 on the CPU
    .venv/bin/python benchmarks/quantize.py --device cuda --model qwen2.5-1.5b-bf16

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
import statistics
import subprocess
import sys
import tempfile
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="bf16 model dir (default: the built-in SmolLM2)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--num-samples", type=int, help="AWQ calibration samples (default: qlift's for the device)")
    ap.add_argument("--seq-len", type=int, help="AWQ tokens per sample (default: qlift's for the device)")
    ap.add_argument("--repeat", type=int, default=3, help="FP8 runs of each kind (median reported)")
    ap.add_argument("--skip-awq", action="store_true")
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
