"""What the router's content filter costs per request: the shipped filter (normalisation + one
Aho-Corasick pass over every text field) against the filter it replaced (one whole-word
regular expression per rule, tried in turn on the raw text), same rules, same prompts, one run.

The old filter is reproduced here as it was (``(?<!\\w)WORD(?!\\w)``, case-insensitive, rules
tried in file order) only to compare speed: it missed CJK words inside sentences, full-width
and zero-width spellings, and most of the fields the new one reads.

    .venv/bin/python benchmarks/router_filter.py [--rules 2000] [--prompts 500] [--chars 2000] [--json]

Prints checks per second of each, and the ratio new / old. Then the answer filter (issue 43), same rules:
a streamed answer's chunks through ``answerfilter.StreamFilter`` (its held window, one check a chunk)
against the same chunks only parsed (what the relay does without it), in microseconds a chunk; and whole
answers checked at once, per second.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import tempfile
import time
from pathlib import Path

from qlift.router.answerfilter import AnswerFilter, StreamFilter, filter_whole
from qlift.router.filters import WordListFilter, prompt_text

WORDS = ("model", "token", "stream", "server", "router", "canary", "weight", "answer", "prompt", "budget")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def make_rules(n: int, rng: random.Random) -> list[str]:
    rules = []
    for i in range(n):
        if i % 4 == 0:  # a CJK word
            rules.append("".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(2)))
        elif i % 4 == 1:  # a phrase
            rules.append(f"{rng.choice(WORDS)}x{i} {rng.choice(WORDS)}")
        else:
            rules.append(f"blocked{i}word")
    return rules


def make_bodies(n: int, chars: int, rng: random.Random) -> list[dict[str, object]]:
    bodies = []
    for _ in range(n):
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < chars:
            words.append(rng.choice(WORDS) if rng.random() < 0.9 else chr(rng.randint(0x4E00, 0x9FFF)))
        text = " ".join(words)
        bodies.append({"messages": [{"role": "system", "content": "You are helpful."},
                                    {"role": "user", "content": text}], "max_tokens": 64})
    return bodies


def old_filter(rules: list[str]) -> list[re.Pattern[str]]:
    return [re.compile(r"(?<!\w)" + re.escape(r) + r"(?!\w)", re.IGNORECASE) for r in rules]


def old_prompt_text(body: dict[str, object]) -> str:
    parts = []
    for m in body.get("messages") or []:  # type: ignore[attr-defined]
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            parts.append(m["content"])
    return "\n".join(parts)


def rate(fn, items: list[dict[str, object]], min_s: float = 2.0) -> float:  # type: ignore[no-untyped-def]
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_s:
        for item in items:
            fn(item)
        done += len(items)
    return done / (time.perf_counter() - t0)


def make_streams(n: int, chunks: int, rng: random.Random) -> list[list[bytes]]:
    """``n`` streamed chat answers of ``chunks`` SSE data lines (a token of 2-8 characters each), no rule in them."""
    streams = []
    for _ in range(n):
        lines = []
        for _ in range(chunks):
            token = rng.choice(WORDS)[: rng.randint(2, 8)] + (" " if rng.random() < 0.5 else "")
            event = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": token}, "finish_reason": None}]}
            lines.append(b"data: " + json.dumps(event, separators=(",", ":")).encode())
        streams.append(lines)
    return streams


def stream_cost(streams: list[list[bytes]], flt: AnswerFilter | None, min_s: float = 2.0) -> float:
    """Microseconds a chunk: parse each data line, and with ``flt`` pass it through a StreamFilter."""
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_s:
        for lines in streams:
            sf = StreamFilter(flt) if flt is not None else None
            for line in lines:
                event = json.loads(line[5:])
                if sf is not None:
                    sf.line(line, event)
                    sf.line(b"")
            if sf is not None:
                sf.line(b"data: [DONE]", done=True)
            done += len(lines)
    return (time.perf_counter() - t0) / done * 1e6


def answer_results(flt: AnswerFilter, rng: random.Random, answers: int, chunks: int) -> dict[str, float]:
    streams = make_streams(answers, chunks, rng)
    plain_us, filtered_us = stream_cost(streams, None), stream_cost(streams, flt)
    wholes = [{"choices": [{"index": 0, "message": {"content": "".join(json.loads(ln[5:])["choices"][0]["delta"]
                                                                         ["content"] for ln in lines)}}]}
              for lines in streams]
    whole_rate = rate(lambda a: filter_whole(flt, a), wholes)  # type: ignore[arg-type]
    return {"answer_chunks": chunks, "hold_chars": flt.hold, "parse_us_per_chunk": round(plain_us, 2),
            "filtered_us_per_chunk": round(filtered_us, 2), "filter_us_per_chunk": round(filtered_us - plain_us, 2),
            "whole_answers_per_s": round(whole_rate, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", type=int, default=2000)
    ap.add_argument("--prompts", type=int, default=500)
    ap.add_argument("--chars", type=int, default=2000)
    ap.add_argument("--answers", type=int, default=50, help="streamed answers for the answer filter's figures")
    ap.add_argument("--answer-chunks", type=int, default=500)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(0)
    rules = make_rules(args.rules, rng)
    bodies = make_bodies(args.prompts, args.chars, rng)
    path = Path(tempfile.mkdtemp()) / "blocked.txt"
    path.write_text("\n".join(rules) + "\n", encoding="utf-8")
    new = WordListFilter(path)
    old = old_filter(rules)

    def old_check(body: dict[str, object]) -> bool:
        text = old_prompt_text(body)
        return any(p.search(text) for p in old)

    def new_check(body: dict[str, object]) -> bool:
        return new.check(prompt_text(body)) is not None

    blocked = sum(new_check(b) for b in bodies)
    old_rate, new_rate = rate(old_check, bodies), rate(new_check, bodies)
    result = {"cpu": cpu_name(), "rules": args.rules, "prompts": args.prompts, "chars": args.chars,
              "blocked_new": blocked, "blocked_old": sum(old_check(b) for b in bodies),
              "old_checks_per_s": round(old_rate, 1), "new_checks_per_s": round(new_rate, 1),
              "ratio_new_over_old": round(new_rate / old_rate, 2)}
    result |= answer_results(AnswerFilter.of(new), rng, args.answers, args.answer_chunks)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['cpu']}: {args.rules} rules, {args.prompts} chat prompts of ~{args.chars} chars")
        print(f"  old (a regex per rule): {old_rate:10.1f} checks/s   blocked {result['blocked_old']}")
        print(f"  new (Aho-Corasick):     {new_rate:10.1f} checks/s   blocked {blocked}")
        print(f"  new / old: {result['ratio_new_over_old']}x")
        print(f"answers ({args.answers} streams of {args.answer_chunks} chunks, {result['hold_chars']} chars held):")
        print(f"  parse only:         {result['parse_us_per_chunk']:10.2f} us/chunk")
        print(f"  parse + filter:     {result['filtered_us_per_chunk']:10.2f} us/chunk "
              f"(filter {result['filter_us_per_chunk']:.2f} us)")
        print(f"  whole answers:      {result['whole_answers_per_s']:10.1f} checks/s")


if __name__ == "__main__":
    main()
