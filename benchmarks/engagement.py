"""The engagement check (``disengaged``) on healthy answers and seeded deflections, and what it costs.

The sets are tests/engagement_sets.py's: 53 prompts in 15 languages with two healthy answers each (an
LLM-style one and a terse one), and per prompt 8 deflections of its language (en, es, zh, ru, ja: small talk,
boilerplate, another subject, "consult a professional", another user's answer, each with a seeded opener and
closer), the healthy answer to another prompt of its language, English boilerplate; deflections that first
name the prompt's topic ("echo") apart. Other healthy sets in tests/data are read where they exist. Printed:
the share flagged of all answers and of those judged, alone (split windows) and beside the other version's
answer (shadow pairs: a healthy answer beside the other healthy one, a deflection beside a healthy answer);
then the fastest of ``--repeat`` cold runs over 2,000 answers, alone and as 1,000 shadow pairs.

    .venv/bin/python benchmarks/engagement.py [--seed 0] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from engagement_sets import Case, deflection_cases, echo_cases, healthy_cases  # noqa: E402

from qlift.quality import content_units  # noqa: E402
from qlift.quality.engagement import disengaged  # noqa: E402

OTHER_HEALTHY = ("healthy_answers.jsonl", "healthy_styles.jsonl")


def rate(cases: list[Case], with_other: bool) -> str:
    got = Counter(disengaged(c.prompt, c.text, c.other if with_other else None) for c in cases)
    judged = got[True] + got[False]
    return (f"{got[True]:4}/{len(cases):<4} = {got[True] / len(cases):5.1%} of all, "
            f"{got[True] / max(1, judged):5.1%} of {judged} judged")


def other_healthy() -> list[Case]:
    out = []
    for name in OTHER_HEALTHY:
        path = REPO / "tests" / "data" / name
        if path.exists():
            rows = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines()
                    if ln.strip() and not ln.startswith("#")]
            out += [Case(r.get("lang", "?"), r["prompt"], r["answer"], name) for r in rows
                    if isinstance(r.get("prompt"), str) and isinstance(r.get("answer"), str)]
    return out


def timed(run: Sequence[tuple[str, str, str | None]], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        content_units.content.cache_clear()
        content_units._word_item.cache_clear()
        start = time.perf_counter()
        for prompt, text, other in run:
            disengaged(prompt, text, other)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    healthy, deflected, echoes = healthy_cases(), deflection_cases(args.seed), echo_cases()
    sets = {"healthy": healthy, **{f"deflection: {k}": [c for c in deflected if c.kind == k]
                                   for k in ("template", "another_request", "boilerplate")},
            "deflection: all": deflected, "echo (known gap)": echoes}
    if extra := other_healthy():
        sets["healthy, tests/data (alone only)"] = extra
    for name, cases in sets.items():
        print(f"{name:34} alone {rate(cases, False)} | beside the other {rate(cases, True)}")
    # every prompt and answer unique, so nothing is served from a cache
    cases = (healthy + deflected) * 4
    alone = [(c.prompt + f" ({i})", c.text + f" ({i})", None) for i, c in enumerate(cases[:2000])]
    pairs = [(c.prompt + f" ({i})", c.text + f" ({i})", f"{c.other} [{i}]") for i, c in enumerate(cases[:1000])]
    paired = [row for p, a, o in pairs for row in ((p, a, o), (p, o, a))]
    print(f"2,000 answers alone: {timed(alone, args.repeat):.3f} s; 1,000 shadow pairs (2,000 answers): "
          f"{timed(paired, args.repeat):.3f} s (fastest of {args.repeat}, cold caches)")


if __name__ == "__main__":
    main()
