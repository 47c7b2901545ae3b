"""qlift eval (vLLM offline) against a bare vLLM generate of the same prompts, and a cached rerun.

Peers, in one run on the same machine:
  bare   - a script that loads the model with vLLM (enforce_eager) and answers every prompt
           in one batched call, nothing else: the floor for any vLLM-based eval.
  fresh  - `qlift eval` candidate vs itself with an empty cache: worker subprocess, one
           batched call with the answers and the reference scoring, metrics, bootstrap, reports.
  rerun  - the same eval with another gate: every answer from the cache, no vLLM.

Targets: fresh <= 1.5x bare (the subprocess, scoring and statistics are cheap next to the
engine); rerun >= 10x faster than fresh ("a rerun with another gate is instant").

    .venv/bin/python benchmarks/eval_rerun.py [--model DIR] [--copies 4] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "examples" / "prompts" / "smoke.jsonl"
BARE = """
import json, sys
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    job = json.load(open(sys.argv[1]))
    llm = LLM(model=job["model"], enforce_eager=True, max_model_len=4096)
    p = SamplingParams(temperature=0, max_tokens=job["max_tokens"])
    chats = [r["messages"] for r in job["rows"] if "messages" in r]
    texts = [r["prompt"] for r in job["rows"] if "prompt" in r]
    llm.chat(chats, p, use_tqdm=False)
    if texts:
        llm.generate(texts, p, use_tqdm=False)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, help="model dir (default: the built-in SmolLM2)")
    ap.add_argument("--copies", type=int, default=4, help="prompt set = smoke.jsonl repeated this often")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    if args.model is None:
        from qlift.models.gguf_import import ensure_builtin

        args.model, _ = ensure_builtin("smollm2")
    rows = [json.loads(x) for x in SMOKE.read_text().splitlines() if x.strip() and not x.startswith("#")]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        prompts = t / "prompts.jsonl"
        with open(prompts, "w") as fh:
            for c in range(args.copies):
                for r in rows:
                    fh.write(json.dumps({**r, "id": f"{r['id']}-{c}"}) + "\n")
        n = args.copies * len(rows)
        job = t / "bare.json"
        inputs = [{k: r[k] for k in ("messages", "prompt") if k in r} for r in rows] * args.copies
        job.write_text(json.dumps({"model": str(args.model), "max_tokens": args.max_tokens, "rows": inputs}))
        (t / "bare.py").write_text(BARE)
        t0 = time.monotonic()
        subprocess.run([sys.executable, str(t / "bare.py"), str(job)], check=True, capture_output=True)
        bare = time.monotonic() - t0

        env = {**os.environ, "QLIFT_EVAL_CACHE": str(t / "cache"), "QLIFT_HOME": str(t / "home")}
        qlift = str(Path(sys.executable).parent / "qlift")
        base = [qlift, "eval", str(args.model), "--baseline", str(args.model),
                "--prompts", str(prompts), "--max-tokens", str(args.max_tokens), "--json"]
        t0 = time.monotonic()
        out = subprocess.run([*base, "--gate", "rougeL >= baseline - 0.02"], env=env, check=True,
                             capture_output=True, text=True)
        fresh = time.monotonic() - t0
        assert json.loads(out.stdout)["cache"]["misses"] == n
        t0 = time.monotonic()
        out = subprocess.run([*base, "--gate", "ppl <= baseline * 1.05"], env=env, check=True,
                             capture_output=True, text=True)
        rerun = time.monotonic() - t0
        assert json.loads(out.stdout)["cache"]["backend_runs"] == 0
    print(f"prompts {n}, max_tokens {args.max_tokens}, model {args.model.name}")
    print(f"bare vLLM (load + one batched chat): {bare:7.1f} s")
    print(f"qlift eval, empty cache            : {fresh:7.1f} s   ratio to bare {fresh / bare:5.2f}x (target <= 1.5x)")
    print(f"qlift eval rerun, another gate     : {rerun:7.1f} s   {fresh / rerun:5.1f}x faster than fresh "
          "(target >= 10x)")


if __name__ == "__main__":
    main()
