"""qlift batch against raw vLLM and a loop of single requests to a vLLM server, on the same prompts.

Peers, in one run on the same machine, each a whole process (interpreter and engine start
included), one after the other on the same cores, the same chat prompts, greedy, the same
max_tokens and the recipe's engine arguments (`qlift batch`'s auto recipe):
  raw       - a script that builds vllm.LLM with those arguments and vLLM's own process layout
              (on the CPU: an engine-core process and a model-worker process, each spawned) and
              answers every prompt with one batched llm.chat call.
  qlift     - `qlift batch MODEL prompts.jsonl -o out.jsonl` (input check, worker, durable output).
              On a CPU-only host qlift runs the engine inside its worker process (see
              qlift.perf.engine.in_process_threads): the only engine setting that differs from raw.
  raw-same  - raw again with exactly qlift's engine settings (in-process engine, same compute
              threads): what is left is qlift's own overhead.
  serial    - a vLLM OpenAI server with the same arguments, then one chat request at a time. Its
              loop is timed over the first --serial-prompts prompts (default 64) and scaled to all
              of them (server start + loop time x all / timed); --serial-prompts 0 runs them all.

Targets (issue 13), in output tokens per second of wall time: qlift >= 5x serial and >= 0.95x raw.
One PASS/FAIL line per target (and one for raw-same); also tokens per second of generation alone.

    .venv/bin/python benchmarks/batch_vs_serial.py [--model DIR] [--prompts 256] [--max-tokens 64]
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
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
RAW = """
import json, os, sys, time
if __name__ == "__main__":
    t0 = time.monotonic()
    from vllm import LLM, SamplingParams
    job = json.load(open(sys.argv[1]))
    if job["threads"]:  # what qlift's worker does for an in-process engine
        import torch
        torch.set_num_threads(job["threads"])
    llm = LLM(model=job["model"], **job["engine_args"])
    t1 = time.monotonic()
    outs = llm.chat(job["chats"], SamplingParams(temperature=0, max_tokens=job["max_tokens"]), use_tqdm=False)
    t2 = time.monotonic()
    with open(job["result"], "w") as fh:
        json.dump({"tokens": sum(len(o.outputs[0].token_ids) for o in outs), "generate_s": t2 - t1}, fh)
    os._exit(0)  # no engine teardown, like qlift's worker: both peers pay only for their work
"""
TOPICS = ["the sea", "a lighthouse", "bread", "a violin", "winter", "a robot", "trains", "the moon", "gardens",
          "chess", "a library", "rain"]


def prompts(n: int) -> list[list[dict[str, str]]]:
    kinds = ["Write a short poem about {}.", "Explain {} to a child.", "List five facts about {}.",
             "Tell a story about {}."]
    return [[{"role": "user", "content": kinds[i % 4].format(TOPICS[i % len(TOPICS)]) + f" ({i})"}] for i in range(n)]


def run_whole(argv: list[str], stdout: Path, env: dict[str, str] | None = None) -> float:
    """Run ``argv`` to its exit in a session of its own and return its wall time, then end what it
    left behind (vLLM's engine process outlives a parent that exits without tearing it down)."""
    t0 = time.monotonic()
    with open(stdout, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, cwd=REPO, start_new_session=True,
                                env={**os.environ, **(env or {})})
        rc = proc.wait()
    wall = time.monotonic() - t0
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if rc != 0:
        raise SystemExit(f"{argv[1:4]} failed with exit code {rc}")
    return wall


def load() -> str:
    return open("/proc/loadavg").read().strip() + f" ({os.cpu_count()} cores)"


def run_raw(t: Path, name: str, model: Path, engine: Any, chats: list[Any], max_tokens: int) -> dict[str, float]:
    job = t / f"{name}.job.json"
    job.write_text(json.dumps({"model": str(model), "engine_args": engine.engine_args, "threads": engine.threads,
                               "chats": chats, "max_tokens": max_tokens, "result": str(t / f"{name}.json")}))
    print(f"[{name}] load average {load()}", flush=True)
    wall = run_whole([sys.executable, str(t / "raw.py"), str(job)], t / f"{name}.log", env=engine.env)
    r = json.loads((t / f"{name}.json").read_text())
    return {"wall_s": wall, "tokens": r["tokens"], "generate_s": r["generate_s"]}


def run_qlift(t: Path, model: Path, chats: list[Any], max_tokens: int) -> dict[str, float]:
    src = t / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "messages": c, "temperature": 0}) + "\n" for i, c in enumerate(chats)))
    print(f"[qlift] load average {load()}", flush=True)
    wall = run_whole([sys.executable, "-m", "qlift", "--json", "batch", str(model), str(src), "-o",
                      str(t / "out.jsonl"), "--set", "max_model_len=2048", "--max-tokens", str(max_tokens)],
                     t / "qlift.json")
    q = json.loads((t / "qlift.json").read_text())
    return {"wall_s": wall, "tokens": q["completion_tokens"], "generate_s": q["generate_s"]}


def run_serial(t: Path, model: Path, engine: Any, chats: list[Any], max_tokens: int, timed: int) -> dict[str, float]:
    from qlift.vllm.server import VllmServer

    extra = [f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')}={v}"
             for k, v in engine.engine_args.items() if v is not False]
    sample = chats[:timed] if timed else chats
    print(f"[serial] load average {load()}", flush=True)
    t0 = time.monotonic()
    with VllmServer(model=model, served_model_name="m", log_path=t / "server.log", extra_args=extra) as server:
        t1 = time.monotonic()
        tokens = 0
        with httpx.Client(timeout=600) as client:
            for c in sample:
                r = client.post(f"{server.base_url}/v1/chat/completions",
                                json={"model": "m", "messages": c, "max_tokens": max_tokens, "temperature": 0})
                r.raise_for_status()
                tokens += r.json()["usage"]["completion_tokens"]
        t2 = time.monotonic()
    scale = len(chats) / len(sample)  # the loop's time and tokens scaled to every prompt
    return {"wall_s": (t1 - t0) + (t2 - t1) * scale, "tokens": tokens * scale, "generate_s": (t2 - t1) * scale}


def verdict(ratio: float, target: float) -> str:
    return "PASS" if ratio >= target else "FAIL"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, help="model dir (default: the built-in SmolLM2)")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--serial-prompts", type=int, default=64, help="prompts the serial loop is timed on (0: all)")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from qlift.models.gguf_import import ensure_builtin
    from qlift.perf.engine import engine_for

    model = (args.model or ensure_builtin("smollm2")[0]).resolve()
    raw_engine = engine_for(model, recipe="auto", sets=["max_model_len=2048"])
    same_engine = engine_for(model, recipe="auto", sets=["max_model_len=2048"], in_process=True)
    chats = prompts(args.prompts)
    timed = min(args.serial_prompts, len(chats))
    print(f"model {model.name}, {len(chats)} chat prompts, max_tokens {args.max_tokens}, greedy, "
          f"VLLM_CPU_KVCACHE_SPACE={os.environ['VLLM_CPU_KVCACHE_SPACE']}")
    print(f"raw:      LLM(**{raw_engine.engine_args}), vLLM's own process layout, env {raw_engine.env}")
    print(f"qlift:    `qlift batch` with recipe {same_engine.recipe.name}: {same_engine.engine_args}, "
          f"env {same_engine.env}, torch threads {same_engine.threads}")
    print(f"raw-same: LLM(**{same_engine.engine_args}), env {same_engine.env}, torch threads {same_engine.threads}")
    print(f"serial:   vLLM server with {raw_engine.engine_args}, loop timed on "
          f"{timed or len(chats)} of {len(chats)} prompts" + (", scaled to all" if timed else ""))
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="qlift-bvs-") as tmp:
        t = Path(tmp)
        (t / "raw.py").write_text(RAW)
        results["raw"] = run_raw(t, "raw", model, raw_engine, chats, args.max_tokens)
        results["qlift"] = run_qlift(t, model, chats, args.max_tokens)
        results["raw-same"] = run_raw(t, "raw-same", model, same_engine, chats, args.max_tokens)
        results["serial"] = run_serial(t, model, raw_engine, chats, args.max_tokens, timed)
    print(f"load average after: {load()}")
    print(f"{'peer':<9} {'wall s':>8} {'tokens':>7} {'tok/s (wall)':>13} {'gen s':>7} {'tok/s (gen)':>12}")
    for name, r in results.items():
        r["tps_wall"] = r["tokens"] / r["wall_s"]
        r["tps_gen"] = r["tokens"] / r["generate_s"]
        print(f"{name:<9} {r['wall_s']:>8.1f} {r['tokens']:>7.0f} {r['tps_wall']:>13.1f} {r['generate_s']:>7.1f} "
              f"{r['tps_gen']:>12.1f}")
    q = results["qlift"]
    for peer, target, what in (("serial", 5.0, "a loop of single requests"), ("raw", 0.95, "raw vLLM LLM.chat"),
                               ("raw-same", 0.95, "raw LLM.chat with qlift's engine settings")):
        ratio = q["tps_wall"] / results[peer]["tps_wall"]
        gen = q["tps_gen"] / results[peer]["tps_gen"]
        print(f"{verdict(ratio, target)}: qlift / {peer} = {ratio:.3f}x of wall time (target >= {target}; "
              f"{gen:.3f}x of generation) - against {what}")


if __name__ == "__main__":
    main()
