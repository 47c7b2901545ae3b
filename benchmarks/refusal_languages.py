"""What the refusal check costs on mixed-language traffic: ``qlift.quality.refusal.refuses`` over N answers of
~200 words (tokens: a CJK character is one) in the 18 languages it ships patterns for.

Each answer is in one language, drawn evenly, and made of that language's ordinary sentences from
``tests/data/refusal_languages.jsonl`` (its ``refuses: false`` rows: support and programming answers, polite
openings that are no refusal, a program's "cannot", quoted refusals), shuffled; a share of them (``--refusals``)
opens with one of its refusals instead, in the first or second sentence. Prints, on this CPU:

- the fastest of ``--repeat`` passes over all answers (wall and CPU time), and the first pass of a fresh
  process's caches (the pattern files read and compiled);
- how many answers it flagged against how many open with a refusal (they should agree).

PASS when the fastest pass takes under 0.5 s.

    .venv/bin/python benchmarks/refusal_languages.py [--answers 2000] [--words 200] [--refusals 0.1] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from qlift.hardware import detect_cpu
from qlift.quality import refusal, refusal_patterns
from qlift.quality.text import tokens

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "refusal_languages.jsonl"
TARGET_S = 0.5


def load(path: Path = DATA) -> dict[str, dict[bool, list[str]]]:
    by_lang: dict[str, dict[bool, list[str]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            row = json.loads(line)
            by_lang.setdefault(row["lang"], {True: [], False: []})[row["refuses"]].append(row["text"])
    return by_lang


def answers(n: int, words: int, refusal_share: float, seed: int) -> list[tuple[str, bool]]:
    """``n`` (answer, opens with a refusal) pairs."""
    rng = random.Random(seed)
    data = load()
    out = []
    for _ in range(n):
        lang = rng.choice(sorted(data))
        sentences: list[str] = []
        while sum(len(tokens(s)) for s in sentences) < words:
            sentences.append(rng.choice(data[lang][False]))
        refuses = rng.random() < refusal_share
        if refuses:
            sentences.insert(rng.randrange(2), rng.choice(data[lang][True]))
        out.append((" ".join(sentences), refuses))
    return out


def timed(texts: list[str]) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    flagged = sum(refusal.refuses(t) for t in texts)
    return time.perf_counter() - wall, time.process_time() - cpu, flagged


def run(n: int, words: int, refusal_share: float, seed: int, repeat: int) -> dict[str, Any]:
    pairs = answers(n, words, refusal_share, seed)
    texts = [t for t, _ in pairs]
    for cache in (refusal_patterns.builtin_files, refusal_patterns.shipped, refusal_patterns.patterns,
                  refusal._clause_marks):
        cache.cache_clear()
    cold_wall, _, _ = timed(texts)
    best_wall = best_cpu = float("inf")
    for _ in range(repeat):
        wall, cpu, flagged = timed(texts)
        best_wall, best_cpu = min(best_wall, wall), min(best_cpu, cpu)
    opened = sum(r for _, r in pairs)
    missed = sum(r and not refusal.refuses(t) for t, r in pairs)
    return {"cpu": detect_cpu().model, "answers": n, "mean_tokens": sum(len(tokens(t)) for t in texts) / n,
            "cold_s": round(cold_wall, 3), "best_wall_s": round(best_wall, 3), "best_cpu_s": round(best_cpu, 3),
            "open_with_refusal": opened, "flagged": flagged, "missed": missed,
            "pass": best_wall < TARGET_S}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--answers", type=int, default=2000)
    ap.add_argument("--words", type=int, default=200)
    ap.add_argument("--refusals", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = run(a.answers, a.words, a.refusals, a.seed, a.repeat)
    if a.json:
        print(json.dumps(out))
        return
    print(f"{out['cpu']}: {out['answers']} answers, {out['mean_tokens']:.0f} tokens each on average")
    print(f"refuses() over all: {out['best_wall_s']:.3f} s (CPU {out['best_cpu_s']:.3f} s; fastest of {a.repeat}), "
          f"first pass with cold caches {out['cold_s']:.3f} s")
    print(f"flagged {out['flagged']}, opening with a refusal {out['open_with_refusal']}, of those missed "
          f"{out['missed']}")
    print(f"{'PASS' if out['pass'] else 'FAIL'}: under {TARGET_S} s")


if __name__ == "__main__":
    main()
