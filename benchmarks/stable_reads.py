"""The stable reads the canary: how broken and healthy canaries score under the stable model, and what it costs.

Against a running vLLM server of the stable model (SmolLM2 in the measurement docs/promote-checks.md quotes):

1. ~50 prompts (English, Chinese and a few other languages: examples/prompts/smoke.jsonl, tests/data/heldout-zh.jsonl,
   the support deck of tests/judge_families.py), the stable's own answers (greedy), and canaries made from them:
   broken ones (cp1252 mojibake on a fifth of the sentences, byte-level BPE symbols left in, U+FFFD replacement
   characters, an answer in another language written by the same model told to, chat-template debris, padding, a
   deflection) and healthy ones (the same model sampled at temperature 0.7, the stable's sentences reordered, the
   stable's answer as a list or with one more sentence). Each is scored under the stable (qlift.quality.scorer)
   and judged by the ``stable_reads`` check with default limits, paired (a shadow window) and unpaired (a split
   window), at the level a window with every check gives it.
2. Cost: scoring throughput (answers/s, prefilled tokens/s) against the server's prefill capacity (long prompts,
   max_tokens 1) and its generation throughput.

    .venv/bin/python benchmarks/stable_reads.py --url http://127.0.0.1:8001 --model smollm2 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import httpx  # noqa: E402
from judge_families import DEFLECTIONS, PADDING, TEMPLATES, deck  # noqa: E402

from qlift.eval.prompts import load_prompts  # noqa: E402
from qlift.quality.language import prompt_script  # noqa: E402
from qlift.quality.scorer import ScorerSettings, score_answers  # noqa: E402
from qlift.rollout.check_types import WindowKind  # noqa: E402
from qlift.rollout.checks import CHECKS  # noqa: E402
from qlift.rollout.read_checks import check_stable_reads  # noqa: E402
from qlift.rollout.spec import AnalysisSpec  # noqa: E402
from qlift.rollout.stable_reads import CANARY, STABLE, ReadAnswer, StableReads  # noqa: E402

GENERAL = ["Explain in a few sentences why the sky is blue.", "Give me three tips for sleeping better.",
           "What is the difference between a list and a tuple in Python?", "How do I boil an egg?",
           "Write a short thank-you note to a colleague who helped me move.",
           "What are the main causes of inflation?", "Summarize the plot of Romeo and Juliet in three sentences.",
           "How can I make my laptop battery last longer?"]
OTHER = {"Han": "Always answer in English, whatever language the user writes in.",
         "Latin": "Always answer in French, whatever language the user writes in."}


def prompts() -> list[list[dict[str, str]]]:
    out = [[m.model_dump() for m in ex.messages] if ex.messages else [{"role": "user", "content": ex.prompt or ""}]
           for path in (REPO / "examples/prompts/smoke.jsonl", REPO / "tests/data/heldout-zh.jsonl")
           for ex in load_prompts(path)]
    out += [p.body["messages"] for p in deck(2) if p.kind in ("refund", "error")]
    return out + [[{"role": "user", "content": q}] for q in GENERAL]


def chat(url: str, model: str, messages: list[dict[str, str]], temperature: float, seed: int,
         max_tokens: int) -> tuple[str, int]:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
        "model": model, "messages": messages, "temperature": temperature, "seed": seed, "max_tokens": max_tokens})
    r.raise_for_status()
    body = r.json()
    return body["choices"][0]["message"]["content"] or "", body["usage"]["completion_tokens"]


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?。！？\n])\s*", text) if s.strip()]


def _join(parts: list[str], like: str) -> str:
    return ("" if re.search("[\u3040-\u30ff\u4e00-\u9fff]", like) else " ").join(parts)


def _byte_bpe(text: str) -> str:  # a detokenizer that forgot GPT-2's byte map: "Ġ" for spaces, "Ċ" for newlines
    return text.replace(" ", "Ġ").replace("\n", "Ċ")


def broken(messages: list[dict[str, str]], text: str, rng: random.Random) -> dict[str, str]:
    parts = _sentences(text) or [text]
    fifth = set(rng.sample(range(len(parts)), max(1, math.ceil(len(parts) / 5))))
    mojibake = _join([p.encode("utf-8").decode("cp1252", errors="replace") if i in fifth else p
                      for i, p in enumerate(parts)], text)
    chars = list(text)
    for i in rng.sample(range(len(chars)), max(2, len(chars) // 25)) if len(chars) > 2 else []:
        chars[i] = "\ufffd"
    zh = prompt_script(messages[-1]["content"]) == "Han"
    first = parts[0]
    return {"mojibake_fifth": mojibake, "byte_bpe": _byte_bpe(text), "replacement_chars": "".join(chars),
            "debris_im_start": TEMPLATES["im_start"](text), "debris_turn_mid": TEMPLATES["turn_mid"](text),
            "padding_dots": first + PADDING["dots"] * 3, "padding_emoji": first + PADDING["emoji"] * 2,
            "deflection": DEFLECTIONS["zh" if zh else "en"][rng.randrange(5)]}


def healthy(text: str) -> dict[str, str]:
    """The same content another way; a last sentence cut at max_tokens is left out first (moving or extending a
    cut sentence would make a break no model writes)."""
    parts = _sentences(text) or [text]
    if len(parts) > 1 and not re.search(r"[.!?。！？)\]`*]\s*$", parts[-1]):
        parts = parts[:-1]
        text = _join(parts, text)
    zh = bool(re.search("[\u4e00-\u9fff]", text))
    more = "如有其他问题，欢迎随时联系我们。" if zh else "If you have any other questions, just let me know."
    return {"reordered": _join(parts[::-1], text), "as_list": "\n".join(f"- {s}" for s in parts),
            "one_more_sentence": _join([*parts, more], text), "emoji": text + (" 🙏" if zh else " 🙂")}


def judged(name: str, prompts_: list[list[dict[str, str]]], canary: list[Any], stable: list[Any], a: AnalysisSpec,
           alpha: float) -> dict[str, Any]:
    answers = []
    for i, (m, c, s) in enumerate(zip(prompts_, canary, stable, strict=True)):
        script = prompt_script(m[-1]["content"])
        for side, sc in ((CANARY, c), (STABLE, s)):
            if sc is not None:
                answers.append(ReadAnswer(side, sc.nll, sc.low_share, sc.tokens, script, i))
    reads = StableReads("stable", answers, 2 * len(canary))
    out: dict[str, Any] = {"family": name}
    for kind in (WindowKind.SHADOW, WindowKind.SPLIT):
        r = check_stable_reads(reads, kind, a, alpha)
        assert r is not None
        out[kind.value] = {"status": r.status.value, "p": r.p_value, "detail": r.detail}
    cs = [c for c in canary if c is not None]
    out["nll"] = sum(c.nll for c in cs) / len(cs)
    out["low_share"] = sum(c.low_share for c in cs) / len(cs)
    return out


def prefill_capacity(url: str, model: str, n: int = 6, length: int = 1500) -> dict[str, float]:
    """Prefill tokens/s of the server: long prompts (``length`` tokens of prose), max_tokens 1, one at a time."""
    text = " ".join(GENERAL) * 40
    ids = httpx.post(f"{url}/tokenize", json={"model": model, "prompt": text}).json()["tokens"][:length]
    tokens, t0 = 0, time.monotonic()
    for i in range(n):
        r = httpx.post(f"{url}/v1/completions", timeout=300, json={
            "model": model, "prompt": [ids[0] + i, *ids[1:]], "max_tokens": 1, "temperature": 0})
        r.raise_for_status()
        tokens += r.json()["usage"]["prompt_tokens"]
    return {"prefill_tokens": tokens, "prefill_tokens_per_s": tokens / (time.monotonic() - t0)}


def plain_prefill(url: str, model: str, items: list[tuple[list[dict[str, str]], str]]) -> float:
    """Seconds for the server to prefill the same rendered requests and answers with no prompt_logprobs (two at a
    time, max_tokens 1): what the scoring would cost without reading the log-probabilities."""
    def one(item: tuple[list[dict[str, str]], str]) -> None:
        httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
            "model": model, "messages": [*item[0], {"role": "assistant", "content": item[1]}], "max_tokens": 1,
            "add_generation_prompt": False, "continue_final_message": True}).raise_for_status()

    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, items))
    return time.monotonic() - t0


def cost(url: str, model: str, items: list[tuple[list[dict[str, str]], str]]) -> dict[str, float]:
    """Scoring against plain prefill of the same tokens and against long-prompt prefill, back to back."""
    settings = ScorerSettings(url, model, concurrency=2, timeout_s=60, deadline_s=3600)
    t0 = time.monotonic()
    run = score_answers(items, settings)
    score_s = time.monotonic() - t0
    plain_s = plain_prefill(url, model, items)
    cap = prefill_capacity(url, model)
    out = {"answers": run.scored, "score_s": round(score_s, 2), "answers_per_s": run.scored / score_s,
           "prefilled_tokens": run.prompt_tokens, "scoring_tokens_per_s": run.prompt_tokens / score_s,
           "plain_prefill_s": round(plain_s, 2), "plain_prefill_tokens_per_s": run.prompt_tokens / plain_s,
           "mean_prefill_tokens_per_answer": run.prompt_tokens / max(1, run.scored), **cap}
    window = 96 * out["mean_prefill_tokens_per_answer"]  # 48 answers per version
    out["window_scoring_s"] = 96 / out["answers_per_s"]
    out["share_of_long_prefill_30s"] = window / (cap["prefill_tokens_per_s"] * 30)
    out["share_of_core_30s"] = out["window_scoring_s"] / 30
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--answers", type=Path, help="keep the generated answers here and reuse them on a rerun")
    ap.add_argument("--cost-only", action="store_true", help="only the cost: score the stable's answers, 3 times")
    args = ap.parse_args()
    url, model = args.url.rstrip("/"), args.model
    ps = prompts()
    print(f"{len(ps)} prompts", flush=True)

    def gen(job: tuple[list[dict[str, str]], float, int]) -> tuple[str, int]:
        return chat(url, model, job[0], job[1], job[2], args.max_tokens)

    kept = json.loads(args.answers.read_text()) if args.answers and args.answers.exists() else None
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        greedy = list(pool.map(gen, [(m, 0.0, 0) for m in ps]))
        gen_s = time.monotonic() - t0
        if kept is None:
            kept = {"sampled": list(pool.map(gen, [(m, 0.7, 1) for m in ps])),
                    "sampled2": list(pool.map(gen, [(m, 0.7, 2) for m in ps])),
                    "other": list(pool.map(gen, [([{"role": "system", "content": OTHER.get(
                        prompt_script(m[-1]["content"]) or "", OTHER["Latin"])}]
                        + [x for x in m if x["role"] != "system"], 0.0, 0) for m in ps]))}
            if args.answers:
                args.answers.write_text(json.dumps(kept, ensure_ascii=False))
    sampled, sampled2, other = kept["sampled"], kept["sampled2"], kept["other"]
    gen_tokens = sum(n for _, n in greedy)
    stable = [t for t, _ in greedy]
    if args.cost_only:
        for _ in range(3):
            print(json.dumps(cost(url, model, list(zip(ps, stable, strict=True)))), flush=True)
        print(f"generation: {gen_tokens / gen_s:.1f} tokens/s (4 at a time, max_tokens {args.max_tokens})")
        return
    rng = random.Random(0)
    canaries: dict[str, list[str]] = {"other_language": [t for t, _ in other]}
    for m, t in zip(ps, stable, strict=True):
        for k, v in broken(m, t, rng).items():
            canaries.setdefault(k, []).append(v)
    healthy_sets: dict[str, list[str]] = {"t0.7": [t for t, _ in sampled]}
    for t in stable:
        for k, v in healthy(t).items():
            healthy_sets.setdefault(k, []).append(v)
    settings = ScorerSettings(url, model, concurrency=2, timeout_s=60, deadline_s=3600)
    base = score_answers(list(zip(ps, stable, strict=True)), settings)
    scored = {"stable (greedy)": base.scores}
    for name, texts in {**canaries, **healthy_sets, "t0.7 seed 2": [t for t, _ in sampled2]}.items():
        scored[name] = score_answers(list(zip(ps, texts, strict=True)), settings).scores
    a = AnalysisSpec()
    family = sum(1 for c in CHECKS if c.tested and WindowKind.SPLIT in c.applies and c.name != "judge")
    alpha = a.alpha / family  # a split window that sees answers, stable_reads included
    rows = [judged(name, ps, scored[name], base.scores, a, alpha) for name in [*canaries, *healthy_sets]]
    rows.append({**judged("t0.7 vs t0.7 (both sampled)", ps, scored["t0.7"], scored["t0.7 seed 2"], a, alpha),
                 "note": "stable sampled at 0.7 too"})
    stable_nll = [s.nll for s in base.scores if s is not None]
    print(f"stable mean NLL {sum(stable_nll) / len(stable_nll):.3f} over {len(stable_nll)} answers")
    print(f"{'family':34} {'NLL':>6} {'low%':>6}  shadow        split")
    for r in rows:
        print(f"{r['family']:34} {r['nll']:6.3f} {r['low_share']:6.1%}  {r['shadow']['status']:12}  "
              f"{r['split']['status']}", flush=True)
    spent = cost(url, model, list(zip(ps, stable, strict=True)))
    spent["generation_tokens_per_s"] = gen_tokens / gen_s
    print(json.dumps(spent, indent=1))
    if args.json:
        scores = {k: [None if x is None else [x.nll, x.low_share, x.tokens] for x in v] for k, v in scored.items()}
        args.json.write_text(json.dumps({"rows": rows, "cost": spent, "scores": scores, "prompts": len(ps)},
                                        indent=1, ensure_ascii=False))

if __name__ == "__main__":
    main()
