"""qlift.quality.text: one tokenization for every text metric, and a ROUGE-L that reads every language
(rouge-score's own scores 0 between two identical Chinese answers) and equals rouge-score's on ASCII."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from faults import ThreadedApp
from hypothesis import given, settings
from hypothesis import strategies as st

from qlift.eval.generation import Generation
from qlift.eval.metrics import score
from qlift.eval.prompts import load_prompts
from qlift.quality import repetition
from qlift.quality.text import lcs_length, rouge_l, tokens
from qlift.rollout.check_types import CheckStatus
from qlift.rollout.pair_checks import AGREEMENT_WORDS, check_agreement
from qlift.rollout.pair_checks import rouge_l as agreement_rouge_l
from qlift.rollout.shadow import Answer, Pair, ShadowEvidence
from qlift.rollout.spec import AnalysisSpec, ShadowSpec

HELDOUT = Path(__file__).resolve().parent / "data" / "heldout-zh.jsonl"
SAME = {"zh": "您好，订单A68915已于周一从仓库发出，预计三天内送达。",
        "ja": "ご連絡ありがとうございます。注文は月曜日に発送済みです。",
        "ru": "Здравствуйте! Заказ отправлен со склада в среду и прибудет через два дня.",
        "ko": "주문하신 상품은 월요일에 발송되었습니다.",
        "hi": "आपका ऑर्डर सोमवार को भेज दिया गया है।",
        "ar": "تم شحن طلبك يوم الاثنين."}


def _rouge_score(reference: str, candidate: str) -> float:
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")  # the reference; qlift no longer imports it
    return float(rouge_scorer.RougeScorer(["rougeL"]).score(reference, candidate)["rougeL"].fmeasure)


def test_tokens_are_words_and_cjk_characters() -> None:
    assert tokens("Don't stop_me NOW, 2 times!") == ["don", "t", "stop", "me", "now", "2", "times"]  # rouge-score's
    assert tokens("订单A68915已发出。") == ["订", "单", "a68915", "已", "发", "出"]
    assert tokens("注文はカートに") == list("注文はカートに")
    assert tokens("Привет, МИР!") == ["привет", "мир"]
    assert tokens("हिन्दी भाषा") == ["हिन्दी", "भाषा"]  # vowel signs are marks: they stay in their word
    assert tokens(unicodedata.normalize("NFD", "café crème")) == ["café", "crème"] == tokens("café crème")
    assert tokens("|---|---| ... **") == []
    assert repetition.tokens is tokens  # the loop and repetition metrics read the same tokens


def test_one_script_table_serves_the_tokens_and_the_routers_filter() -> None:
    from qlift.router.textnorm import has_unspaced, is_unspaced

    assert all(is_unspaced(c) for c in "ขລမកဢ注カ한ㄅ𠀀")  # Thai, Lao, Myanmar, Khmer, Han, kana, Hangul, ...
    assert not has_unspaced("Привет, мир! café हिन्दी")
    assert tokens("ขอบคุณครับ สวัสดี") == ["ขอบคุณครับ", "สวัสดี"]  # no spaces between words, but letters
    assert tokens("𠀀𠀁字") == ["𠀀", "𠀁", "字"]  # ideographs beyond the BMP are one token each, as Han is


@pytest.mark.parametrize("lang", sorted(SAME))
def test_identical_answers_score_one_in_every_language(lang: str) -> None:
    text = SAME[lang]
    assert rouge_l(text, text) == 1.0
    assert agreement_rouge_l(text, text) == 1.0


def test_rouge_score_drops_what_it_cannot_read() -> None:
    """What the issue is about: rouge-score's tokenizer has no token in a Chinese or Russian answer."""
    for text in ("您好，订单已于周一从仓库发出。", SAME["ja"], SAME["ru"]):
        assert _rouge_score(text, text) == 0.0
    assert _rouge_score("订单A68915已发出", "订单A68915被取消") == 1.0  # only 'a68915' is left to compare


def test_partial_overlap_in_chinese_is_graded() -> None:
    ref = "您好，订单已于周一从仓库发出，预计三天内送达，请注意查收。"
    close = "您好，订单已于周二从仓库发出，预计三天内送达。"  # one day changed, last clause gone
    far = "很抱歉，我们无法处理您的请求，请联系人工客服。"
    unrelated = "Your order has shipped."
    s_close, s_far = rouge_l(ref, close), rouge_l(ref, far)
    assert 0.7 < s_close < 1.0
    assert 0.0 < s_far < 0.3 < s_close
    assert rouge_l(ref, unrelated) == 0.0
    assert rouge_l(ref, close) == rouge_l(close, ref)  # F1 is symmetric


def _dp_lcs(a: list[str], b: list[str]) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from("abcdefg"), max_size=80), st.lists(st.sampled_from("abcdefg"), max_size=80))
def test_bit_parallel_lcs_is_the_dp(a: list[str], b: list[str]) -> None:
    assert lcs_length(a, b) == _dp_lcs(a, b) == lcs_length(b, a)


ASCII_TEXT = st.one_of(
    st.lists(st.sampled_from([*"abcAB019 _'-.,!?\n\t", "the ", "don't ", "JSON", "x_y"]), max_size=60).map("".join),
    st.text(alphabet=st.characters(max_codepoint=127), max_size=80))  # every ASCII character


@settings(max_examples=400, deadline=None)
@given(ASCII_TEXT, ASCII_TEXT)
def test_ascii_scores_are_rouge_scores(reference: str, candidate: str) -> None:
    """The demo's English figures do not move: same tokens, same LCS, same float."""
    assert rouge_l(reference, candidate) == _rouge_score(reference, candidate)


def test_long_english_answers_score_as_rouge_score() -> None:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)] + ["Don't", "JSON:", "(a)", "snake_case"]
    a = " ".join(rng.choice(words) for _ in range(900))
    b = " ".join(w if rng.random() < 0.8 else rng.choice(words) for w in a.split())
    assert rouge_l(a, b) == _rouge_score(a, b)


def test_agreement_heads_are_tokens_not_space_separated_words() -> None:
    """Chinese has no spaces: a whitespace head of 100 'words' was the whole answer; now it is 100 characters."""
    head = "订单已发出" * (AGREEMENT_WORDS // 5)
    assert agreement_rouge_l(head + "预计三天内送达", head + "很抱歉无法处理") == 1.0
    assert agreement_rouge_l(head[:-5] + "预计三天内送达", head[:-5] + "很抱歉无法处理") < 1.0


def _pairs(texts: list[tuple[str, str, str]]) -> ShadowEvidence:
    ev = ShadowEvidence("stable", "canary")
    for i, (prompt, stable, canary) in enumerate(texts):
        req = {"messages": [{"role": "user", "content": prompt}]}
        ev.pairs.append(Pair(i, req,
                             Answer("stable", 200, True, 2.0, ttft_s=0.2, text=stable, finish_reason="stop",
                                    completion_tokens=len(stable)),
                             Answer("canary", 200, True, 2.1, ttft_s=0.2, text=canary, finish_reason="stop",
                                    completion_tokens=len(canary))))
    return ev


def test_healthy_canary_on_chinese_traffic_passes_agreement() -> None:
    examples = load_prompts(HELDOUT)
    zh = [(ex.messages[-1].content, ex.reference, ex.reference) for ex in examples
          if ex.tags == ["zh"] and ex.messages and ex.reference]
    ev = _pairs(zh * 3)
    r = check_agreement(ev, ShadowSpec(min_pairs=10), AnalysisSpec(), 0.01)
    assert r.status == CheckStatus.PASS and r.canary == 1.0, r.detail


def test_eval_metrics_read_chinese() -> None:
    ex = load_prompts(HELDOUT)[0]
    assert ex.reference is not None
    same = Generation(ex.reference, 30, 0.1)
    for metric in ("rougeL", "exact_match"):
        s = score(metric, ex, same)
        assert s is not None and s.value == 1.0
    nfd = Generation(unicodedata.normalize("NFD", "가나다"), 3, 0.1)
    assert score("exact_match", ex.model_copy(update={"reference": "가나다"}), nfd).value == 1.0  # type: ignore[union-attr]


# -- qlift eval end to end on the Chinese held-out set, through the endpoint backend ------------------------------

def _partial(reference: str) -> str:
    """The baseline's answer: the reference's first half, then a generic closing."""
    return reference[: len(reference) // 2] + "如有其他问题请随时联系我们。"


class AnswersBackend(ThreadedApp):
    """An OpenAI-compatible server of two models: ``cand`` answers every held-out prompt with its reference,
    ``base`` with half of it. No /tokenize: no perplexity."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        super().__init__()

    async def _chat(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        ref = self.answers[body["messages"][-1]["content"]]
        text = ref if body["model"] == "cand" else _partial(ref)
        return web.json_response({"id": "x", "object": "chat.completion", "model": body["model"],
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": text}}],
                                  "usage": {"prompt_tokens": 9, "completion_tokens": len(text), "total_tokens": 9}})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model", "root": m}
                                                             for m in ("cand", "base")]})

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        return app


@pytest.fixture
def answers_backend() -> Any:
    examples = load_prompts(HELDOUT)
    answers = {ex.messages[-1].content: ex.reference or "" for ex in examples if ex.messages}
    with AnswersBackend(answers) as server:
        yield server


def _eval(run_cli: Any, server: AnswersBackend, candidate: str, baseline: str, *gates: str) -> Any:
    args = ["eval", candidate, "--baseline", baseline, "--backend", "endpoint", "--endpoint", server.url,
            "--prompts", HELDOUT, "--metrics", "rougeL,exact_match,repetition", "--bootstrap", "200", "--no-cache"]
    for g in gates:
        args += ["--gate", g]
    return run_cli(*args, "--json")


def test_eval_gates_on_the_chinese_heldout_set(run_cli: Any, answers_backend: AnswersBackend) -> None:
    r = _eval(run_cli, answers_backend, "cand", "base", "rougeL >= baseline + 0.2", "rougeL >= 0.99",
              "exact_match >= 1")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    overall = {s["metric"]: s for s in data["overall"]}
    assert overall["rougeL"]["candidate"] == 1.0
    assert 0.3 < overall["rougeL"]["baseline"] < 0.9  # half an answer, sensibly graded (rouge-score: ~0)
    assert {g["expr"]: g["passed"] for g in data["gates"]} == {
        "rougeL >= baseline + 0.2": True, "rougeL >= 0.99": True, "exact_match >= 1": True}

    r = _eval(run_cli, answers_backend, "base", "cand", "rougeL >= baseline - 0.02")  # the worse one as candidate
    assert r.exit_code == 10, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: 1 of 1 gate(s) failed: rougeL >= baseline - 0.02")
