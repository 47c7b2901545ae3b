"""What judging one shadow window costs the controller: the judge over N answer pairs.

The agreement check scores ROUGE-L (qlift eval's rouge-score scorer, quadratic in the answers'
lengths) on an even sample of pairs and each answer's opening words, so a busy window costs
about what a quiet one does. Prints seconds per window for growing windows, the same-run ratio
of the largest to the smallest, and PASS when the largest window is judged in under 10% of a
30 s interval (3 s).

    .venv/bin/python benchmarks/shadow_judge.py [--words 300] [--pairs 20,200,2000]
"""

from __future__ import annotations

import argparse
import random
import time

from qlift.rollout.judge import judge
from qlift.rollout.shadow import Answer, Pair, ShadowEvidence
from qlift.rollout.spec import AnalysisSpec, ShadowSpec

VOCAB = [f"w{i}" for i in range(400)]


def window(pairs: int, words: int, seed: int = 0) -> ShadowEvidence:
    rng = random.Random(seed)
    ev = ShadowEvidence("stable", "canary")
    for i in range(pairs):
        stable = [rng.choice(VOCAB) for _ in range(words)]
        canary = [w if rng.random() < 0.8 else rng.choice(VOCAB) for w in stable]  # a close paraphrase
        req = {"messages": [{"role": "user", "content": f"question {i}"}], "stream": True}
        ev.pairs.append(Pair(i, req,
                             Answer("stable", 200, True, 2.0, ttft_s=0.2, text=" ".join(stable), finish_reason="stop",
                                    completion_tokens=words),
                             Answer("canary", 200, True, 2.1, ttft_s=0.2, text=" ".join(canary), finish_reason="stop",
                                    completion_tokens=words)))
    return ev


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=300, help="words per answer")
    parser.add_argument("--pairs", default="20,200,2000", help="window sizes, comma-separated")
    args = parser.parse_args()
    sizes = [int(x) for x in args.pairs.split(",")]
    spec = ShadowSpec(min_pairs=10)
    seconds = {}
    for n in sizes:
        ev = window(n, args.words)
        t0 = time.perf_counter()
        d = judge(ev, AnalysisSpec(), spec)
        seconds[n] = time.perf_counter() - t0
        print(f"{n:>5} pairs x {args.words} words: {seconds[n]:.2f} s ({d.action})")
    lo, hi = min(sizes), max(sizes)
    print(f"ratio {hi} / {lo} pairs: {seconds[hi] / seconds[lo]:.2f}x")
    print(("PASS" if seconds[hi] < 3.0 else "FAIL") + f": {hi} pairs judged in {seconds[hi]:.2f} s (target < 3 s)")


if __name__ == "__main__":
    main()
