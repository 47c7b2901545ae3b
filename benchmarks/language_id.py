"""How well the answer checks tell English from Chinese on short answers: ``qlift.quality.language.detect``
(and raw py3langid ``classify``, for comparison) and the ``off_language`` flag the judge counts.

The labelled set is ``benchmarks/data/short_answers.jsonl``: short support and chat answers written for
this benchmark, in English and in simplified Chinese (the seeds' languages), some carrying product
names and order ids ("iPhone 15", "A12345"). Each is scored whole and cut to its first 5, 10 and 20
words (Chinese: characters). Per bucket:

- ``detect``: the share it names right, the share it leaves undecided (None), the share it names wrong;
- ``py3langid``: the share ``classify`` names right (it always names something);
- ``off_language``: flagged True for an English prompt and an English answer (false positives: should
  be ~0), for an English prompt and a Chinese answer (true positives), and the same two with a Chinese
  prompt; None (too little text) is counted apart.

    .venv/bin/python benchmarks/language_id.py [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import py3langid

from qlift.hardware import detect_cpu
from qlift.quality.language import detect, off_language

DATA = Path(__file__).parent / "data" / "short_answers.jsonl"
BUCKETS: tuple[int | None, ...] = (5, 10, 20, None)  # None: the whole answer
PROMPTS = {"en": "Hi, I need some help with my recent order and my account, can you take a look?",
           "zh": "你好，我最近的订单和账户有点问题，能帮我看一下吗？"}
_EN_WORD = re.compile(r"\S+")


def load(path: Path = DATA) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert all(r["lang"] in ("en", "zh") and r["text"] for r in rows), "each row: {lang: en|zh, text}"
    return rows


def cut(text: str, lang: str, n: int | None) -> str:
    """The first ``n`` words (English) or characters (Chinese) of ``text``; all of it for None."""
    if n is None:
        return text
    if lang == "zh":
        return text[:n]
    return " ".join(_EN_WORD.findall(text)[:n])


def share(hits: int, total: int) -> float:
    return hits / total if total else 0.0


def score(rows: list[dict[str, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": {lang: sum(r["lang"] == lang for r in rows) for lang in ("en", "zh")},
                           "buckets": {}, "misses": []}
    for n in BUCKETS:
        name = "full" if n is None else f"first {n}"
        b: dict[str, Any] = {}
        for lang in ("en", "zh"):
            texts = [cut(r["text"], lang, n) for r in rows if r["lang"] == lang]
            got = [detect(t) for t in texts]
            raw = [str(py3langid.classify(t)[0]) for t in texts]
            other = "zh" if lang == "en" else "en"
            same_flags = [off_language(PROMPTS[lang], t) for t in texts]
            cross_flags = [off_language(PROMPTS[other], t) for t in texts]
            b[lang] = {
                "n": len(texts),
                "detect_right": share(sum(g == lang for g in got), len(texts)),
                "detect_none": share(sum(g is None for g in got), len(texts)),
                "detect_wrong": share(sum(g is not None and g != lang for g in got), len(texts)),
                "langid_right": share(sum(g == lang for g in raw), len(texts)),
                # same-language prompt: a True is a false positive
                "off_language_fp": share(sum(f is True for f in same_flags), len(texts)),
                "off_language_none_same": share(sum(f is None for f in same_flags), len(texts)),
                # the other language's prompt: a True is a true positive
                "off_language_tp": share(sum(f is True for f in cross_flags), len(texts)),
                "off_language_none_cross": share(sum(f is None for f in cross_flags), len(texts)),
            }
            for t, g, f in zip(texts, got, same_flags, strict=True):
                if (g is not None and g != lang) or f is True:
                    out["misses"].append({"bucket": name, "lang": lang, "text": t, "detect": g,
                                          "off_language_same_prompt": f})
        out["buckets"][name] = b
    return out


def cpu_label() -> str:
    cpu = detect_cpu()
    return f"{cpu.model} ({cpu.vector_isa}), {cpu.cores} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="labelled answers, one JSON object a line")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    rows = load(args.data)
    t0 = time.perf_counter()
    result = score(rows)
    result["seconds"] = time.perf_counter() - t0
    result["cpu"] = cpu_label()
    result["py3langid"] = py3langid.__version__ if hasattr(py3langid, "__version__") else None
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=1))
        return
    print(f"CPU: {result['cpu']}; {result['rows']['en']} English and {result['rows']['zh']} Chinese answers "
          f"({args.data.name}); prompts: {PROMPTS['en']!r} / {PROMPTS['zh']!r}")
    print("lang: the answer's. detect: right / undecided / wrong. py3langid: right. off_language flagged True"
          " (None in brackets) under a prompt in the answer's language (false positives) and in the other one"
          " (true positives)")
    print(f"{'bucket':<9} {'lang':<4} {'detect right/none/wrong':>24} {'py3langid':>9} {'FP same':>13} "
          f"{'TP other':>13}")
    for name, b in result["buckets"].items():
        for lang in ("en", "zh"):
            r = b[lang]
            unit = "" if name == "full" else (" ch" if lang == "zh" else " w")
            print(f"{name + unit:<9} {lang:<4} {r['detect_right']:>8.0%} /{r['detect_none']:>5.0%} /"
                  f"{r['detect_wrong']:>5.0%} {r['langid_right']:>9.0%} "
                  f"{r['off_language_fp']:>5.0%} ({r['off_language_none_same']:>4.0%}) "
                  f"{r['off_language_tp']:>5.0%} ({r['off_language_none_cross']:>4.0%})")
    if result["misses"]:
        print("misnamed by detect, or flagged off_language under a same-language prompt:")
        for m in result["misses"]:
            print(f"  [{m['bucket']} {m['lang']}] detect={m['detect']} off_language={m['off_language_same_prompt']}: "
                  f"{m['text']!r}")
    print(f"scored in {result['seconds']:.2f} s")


if __name__ == "__main__":
    main()
