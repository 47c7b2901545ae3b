"""The vLLM side of ``qlift bench``: ``python -m qlift.perf.bench_worker JOB.json``.

Each concurrency level is one run of vLLM's own benchmark client (``vllm.benchmarks.serve``:
its argument parser and ``main``), given only arguments that vLLM 0.26 and 0.32 both have.
Each level's result is appended to ``levels`` as it finishes, so a run stopped at its time
limit keeps the levels it completed.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from qlift.vllm.worker import die_with_group, exit_now, serve_jobs

# Per-request lists vLLM returns with --save-detailed; qlift keeps what it needs of them.
_DETAIL = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "generated_texts", "errors",
           "queue_times")


def level_argv(job: dict[str, Any], concurrency: int) -> list[str]:
    argv = [
        "--backend", "openai", "--base-url", job["base_url"], "--endpoint", "/v1/completions",
        "--model", job["model"], "--served-model-name", job["model"], "--tokenizer", job["tokenizer"],
        "--num-prompts", str(job["requests"]), "--max-concurrency", str(concurrency), "--request-rate", "inf",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
        "--seed", str(job["seed"]), "--temperature", str(job["temperature"]),
        # qlift checks the server itself; vLLM's ready check would send a request the result leaves out
        "--ready-check-timeout-sec", "0", "--num-warmups", "0", "--save-detailed", "--disable-tqdm",
    ]
    if job.get("dataset"):
        argv += ["--dataset-name", "custom", "--dataset-path", job["dataset"], "--output-len", str(job["output_len"])]
    else:
        argv += ["--dataset-name", "random", "--input-len", str(job["input_len"]),
                 "--output-len", str(job["output_len"])]
    if job.get("ignore_eos", True):
        argv.append("--ignore-eos")
    return argv + job.get("goodput_args", [])


def run(job: dict[str, Any]) -> dict[str, Any]:
    import vllm
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    levels_path = Path(job["levels"])
    for c in job["concurrency"]:
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        argv = level_argv(job, c)
        args = parser.parse_args(argv)
        print(f"qlift bench: concurrency {c}: vllm bench serve {' '.join(argv)}", flush=True)
        result = main(args)
        level = {k: v for k, v in result.items() if k not in _DETAIL}
        level["detail"] = {k: result[k] for k in _DETAIL if k in result and k != "generated_texts"}
        level["concurrency"] = c
        with open(levels_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(level) + "\n")
    return {"vllm_version": vllm.__version__}


def main_(argv: list[str]) -> int:
    die_with_group()
    import vllm.benchmarks.serve  # noqa: F401  (the slow import, while the server starts)

    with contextlib.redirect_stdout(sys.stderr):  # vLLM's client prints its tables on stdout
        return serve_jobs(Path(argv[1]), run)  # one job, or (tune) one per grid point


if __name__ == "__main__":
    exit_now(main_(sys.argv))
