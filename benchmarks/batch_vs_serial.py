"""qlift batch against a loop of single requests to a vLLM server and raw vLLM, on the same prompts.

Peers, in one run on the same machine, each a whole process (engine start included), one after
the other, the same chat prompts, greedy, the same max_tokens and engine arguments:
  raw     - a script that loads vllm.LLM and answers every prompt with one batched llm.chat call.
  qlift   - `qlift batch MODEL prompts.jsonl -o out.jsonl` (input check, worker, durable output).
  serial  - a vLLM OpenAI server started for the run, then one chat request at a time.

Targets (issue 13): qlift >= 5x serial and >= 0.95x raw, in output tokens per second of wall time.
Also printed: tokens per second of generation alone (without engine start / server start).

    .venv/bin/python benchmarks/batch_vs_serial.py [--model DIR] [--prompts 64] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
RAW = """
import json, sys, time
if __name__ == "__main__":
    t0 = time.monotonic()
    from vllm import LLM, SamplingParams
    job = json.load(open(sys.argv[1]))
    llm = LLM(model=job["model"], **job["engine_args"])
    t1 = time.monotonic()
    outs = llm.chat(job["chats"], SamplingParams(temperature=0, max_tokens=job["max_tokens"]), use_tqdm=False)
    t2 = time.monotonic()
    with open(job["result"], "w") as fh:
        json.dump({"tokens": sum(len(o.outputs[0].token_ids) for o in outs), "generate_s": t2 - t1}, fh)
    import os
    os._exit(0)  # no engine teardown, like qlift's worker: both peers pay only for their work
"""
TOPICS = ["the sea", "a lighthouse", "bread", "a violin", "winter", "a robot", "trains", "the moon", "gardens",
          "chess", "a library", "rain"]


def prompts(n: int) -> list[list[dict[str, str]]]:
    kinds = ["Write a short poem about {}.", "Explain {} to a child.", "List five facts about {}.",
             "Tell a story about {}."]
    return [[{"role": "user", "content": kinds[i % 4].format(TOPICS[i % len(TOPICS)]) + f" ({i})"}] for i in range(n)]


def run_whole(argv: list[str], stdout: Path) -> None:
    """Run ``argv`` to its exit in a session of its own, then end what it left behind (vLLM's engine
    process outlives a parent that exits without tearing it down)."""
    with open(stdout, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, cwd=REPO, start_new_session=True)
        rc = proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if rc != 0:
        raise SystemExit(f"{argv[1:4]} failed with exit code {rc}")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cores)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, help="model dir (default: the built-in SmolLM2)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from qlift.models.gguf_import import ensure_builtin
    from qlift.perf.engine import engine_for
    from qlift.vllm.server import VllmServer

    model = (args.model or ensure_builtin("smollm2")[0]).resolve()
    engine = engine_for(model, recipe="auto", sets=["max_model_len=2048"])
    chats = prompts(args.prompts)
    print(f"model {model.name}, {len(chats)} chat prompts, max_tokens {args.max_tokens}, engine {engine.engine_args}")
    print(f"load average before: {load()}")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="qlift-bvs-") as tmp:
        t = Path(tmp)
        job = t / "job.json"
        job.write_text(json.dumps({"model": str(model), "engine_args": engine.engine_args, "chats": chats,
                                   "max_tokens": args.max_tokens, "result": str(t / "raw.json")}))
        (t / "raw.py").write_text(RAW)
        t0 = time.monotonic()
        run_whole([sys.executable, str(t / "raw.py"), str(job)], t / "raw.log")
        raw = json.loads((t / "raw.json").read_text())
        results["raw"] = {"wall_s": time.monotonic() - t0, "tokens": raw["tokens"], "generate_s": raw["generate_s"]}

        src = t / "in.jsonl"
        src.write_text("".join(json.dumps({"id": i, "messages": c, "temperature": 0}) + "\n"
                               for i, c in enumerate(chats)))
        t0 = time.monotonic()
        run_whole([sys.executable, "-m", "qlift", "--json", "batch", str(model), str(src), "-o", str(t / "out.jsonl"),
                   "--set", "max_model_len=2048", "--max-tokens", str(args.max_tokens)], t / "qlift.json")
        q = json.loads((t / "qlift.json").read_text())
        results["qlift"] = {"wall_s": time.monotonic() - t0, "tokens": q["completion_tokens"],
                            "generate_s": q["generate_s"]}

        extra = [f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')}={v}"
                 for k, v in engine.engine_args.items() if v is not False]
        t0 = time.monotonic()
        with VllmServer(model=model, served_model_name="m", log_path=t / "server.log", extra_args=extra) as server:
            t1 = time.monotonic()
            tokens = 0
            with httpx.Client(timeout=600) as client:
                for c in chats:
                    r = client.post(f"{server.base_url}/v1/chat/completions",
                                    json={"model": "m", "messages": c, "max_tokens": args.max_tokens, "temperature": 0})
                    r.raise_for_status()
                    tokens += r.json()["usage"]["completion_tokens"]
            t2 = time.monotonic()
        results["serial"] = {"wall_s": time.monotonic() - t0, "tokens": tokens, "generate_s": t2 - t1}
    print(f"load average after:  {load()}")
    print(f"{'peer':<8} {'wall s':>8} {'tokens':>7} {'tok/s (wall)':>13} {'gen s':>7} {'tok/s (gen)':>12}")
    for name, r in results.items():
        r["tps_wall"] = r["tokens"] / r["wall_s"]
        r["tps_gen"] = r["tokens"] / r["generate_s"]
        print(f"{name:<8} {r['wall_s']:>8.1f} {r['tokens']:>7} {r['tps_wall']:>13.1f} {r['generate_s']:>7.1f} "
              f"{r['tps_gen']:>12.1f}")
    q, raw_r, ser = results["qlift"], results["raw"], results["serial"]
    print(f"qlift / serial: {q['tps_wall'] / ser['tps_wall']:.2f}x wall (target >= 5), "
          f"{q['tps_gen'] / ser['tps_gen']:.2f}x generation")
    print(f"qlift / raw:    {q['tps_wall'] / raw_r['tps_wall']:.3f}x wall (target >= 0.95), "
          f"{q['tps_gen'] / raw_r['tps_gen']:.3f}x generation")


if __name__ == "__main__":
    main()
