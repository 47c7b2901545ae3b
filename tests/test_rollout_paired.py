"""Answer checks decided per request: paired (McNemar) in shadow windows, and per prompt script everywhere, so
the stable's own noise cannot hide a canary that is worse on one language's prompts. Evidence is built here
(no server): the live paths that fill it are tests/test_rollout_answers.py and test_promote_adversarial.py."""

from __future__ import annotations

import random

from qlift.quality.registry import Answer as QualityAnswer
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.judge import judge
from qlift.rollout.shadow import Answer, Pair, ShadowEvidence
from qlift.rollout.spec import AnalysisSpec, ShadowSpec


def en_prompt(i: int) -> str:
    return f"Please refund my order A{i:04d}. It arrived broken and I would like my money back."


def zh_prompt(i: int) -> str:
    return f"请为我的订单 A{i:04d} 退款。商品到货时已经损坏，我希望拿回我的钱。"


def en_answer(i: int) -> str:
    return f"Your order A{i:04d} will be refunded within five days. Thank you for your patience."


def zh_answer(i: int) -> str:
    return f"您的订单 A{i:04d} 将在五天内退款。感谢您的耐心等待，祝您生活愉快。"


def _side(text: str) -> Answer:
    return Answer("x", 200, True, 0.5, ttft_s=0.1, text=text, finish_reason="stop", completion_tokens=20)


def _request(prompt: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": prompt}], "stream": False}


def mixed_traffic(n_en: int, n_zh: int, stable_rule: object, canary_rule: object) -> list[tuple[str, str, str]]:
    """(prompt, stable answer, canary answer): English prompts then Chinese ones, shuffled with a fixed seed."""
    rows = [(en_prompt(i), "en", i) for i in range(n_en)] + [(zh_prompt(i), "zh", i) for i in range(n_zh)]
    random.Random(7).shuffle(rows)
    return [(p, stable_rule(lang, i), canary_rule(lang, i)) for p, lang, i in rows]  # type: ignore[operator]


def shadow_of(rows: list[tuple[str, str, str]]) -> ShadowEvidence:
    return ShadowEvidence("stable", "canary", [Pair(i, _request(p), _side(s), _side(c))
                                               for i, (p, s, c) in enumerate(rows)])


def split_of(rows: list[tuple[str, str, str]]) -> Evidence:
    """Each prompt answered by one version only, alternately (a 50% split window)."""
    def version(name: str, picked: list[tuple[str, str]]) -> VersionEvidence:
        ev = VersionEvidence(name, requests=len(picked), errors=0, bad_answers=0, finishes=len(picked),
                             length_finishes=0, completions=len(picked), completion_tokens_sum=20.0 * len(picked),
                             empty=0)
        ev.latency_s = [0.5] * len(picked)
        ev.completion_tokens = [20.0] * len(picked)
        ev.answers = [QualityAnswer(_request(p), t, finish_reason="stop") for p, t in picked]
        return ev
    stable = version("stable", [(p, s) for i, (p, s, _) in enumerate(rows) if i % 2 == 0])
    canary = version("canary", [(p, c) for i, (p, _, c) in enumerate(rows) if i % 2 == 1])
    return Evidence(stable, canary, 0.0, 30.0, "router", weight=50)


def stable_english_everywhere(lang: str, i: int) -> str:
    """A stable that answers its Chinese prompts in English (off-language on every Chinese prompt)."""
    return en_answer(i)


def fixes_chinese_drifts_english(lang: str, i: int) -> str:
    """Answers Chinese prompts in Chinese (better than the stable) and drifts into Chinese on 30% of the
    English ones (worse)."""
    return zh_answer(i) if lang == "zh" or i % 10 < 3 else en_answer(i)


def right_language(lang: str, i: int) -> str:
    return zh_answer(i) if lang == "zh" else en_answer(i)


def test_a_canary_better_on_chinese_but_drifting_on_english_fails_on_the_english_prompts_paired() -> None:
    rows = mixed_traffic(140, 60, stable_english_everywhere, fixes_chinese_drifts_english)
    d = judge(shadow_of(rows), AnalysisSpec(), ShadowSpec(min_pairs=20))
    check = {c.name: c for c in d.checks}["off_language"]
    # the whole window: the canary is off on 42 of 200, the stable on 60 of 200 (a share ratio reads 0.7)
    assert check.status == "fail" and d.action == "rollback", d.reason
    assert check.detail.startswith("on latin prompts:") and check.test == "mcnemar", check.detail
    assert check.p_value is not None and check.p_value < 1e-8


def test_the_same_canary_fails_in_a_split_window_on_the_english_prompts() -> None:
    rows = mixed_traffic(280, 120, stable_english_everywhere, fixes_chinese_drifts_english)
    d = judge(split_of(rows), AnalysisSpec(min_requests=10))
    check = {c.name: c for c in d.checks}["off_language"]
    assert check.status == "fail" and check.detail.startswith("on latin prompts:"), check.detail


def test_a_stable_off_on_chinese_prompts_hides_no_canary_drifting_on_35_percent() -> None:
    """The issue's case: stable 20% off-language, canary 35% (a 1.79 ratio passed a 2x limit)."""
    def canary(lang: str, i: int) -> str:
        return en_answer(i) if lang == "zh" else (zh_answer(i) if i % 16 < 3 else en_answer(i))
    rows = mixed_traffic(160, 40, stable_english_everywhere, canary)
    for ev in (shadow_of(rows), split_of(rows * 2)):
        d = judge(ev, AnalysisSpec(min_requests=10), ShadowSpec(min_pairs=20))
        assert {c.name: c for c in d.checks}["off_language"].status == "fail", d.reason


def test_a_canary_that_answers_each_prompt_in_its_language_passes_both_kinds_of_window() -> None:
    rows = mixed_traffic(140, 60, right_language, right_language)
    for ev in (shadow_of(rows), split_of(rows)):
        d = judge(ev, AnalysisSpec(min_requests=10), ShadowSpec(min_pairs=20))
        assert {c.name: c for c in d.checks}["off_language"].status == "pass", d.reason


def test_a_canary_that_fixes_the_stables_chinese_answers_passes() -> None:
    rows = mixed_traffic(140, 60, stable_english_everywhere, right_language)
    for ev in (shadow_of(rows), split_of(rows)):
        d = judge(ev, AnalysisSpec(min_requests=10), ShadowSpec(min_pairs=20))
        assert {c.name: c for c in d.checks}["off_language"].status == "pass", d.reason


def test_chinese_only_traffic_with_a_healthy_canary_passes_the_shadow_phase() -> None:
    """Identical Chinese answers agree fully (ROUGE-L over characters), so agreement cannot hold it forever."""
    rows = [(zh_prompt(i), zh_answer(i), zh_answer(i)) for i in range(40)]
    d = judge(shadow_of(rows), AnalysisSpec(), ShadowSpec(min_pairs=20))
    checks = {c.name: c for c in d.checks}
    assert checks["agreement"].status == "pass" and (checks["agreement"].canary or 0) > 0.99, checks["agreement"]
    assert d.action == "advance", d.reason


def test_a_paired_check_under_the_minimum_increase_passes_and_names_both_sides() -> None:
    """One extra drift in 100 pairs is no evidence: under min_share_increase the check passes, and its detail
    counts the prompts only the canary's answer was flagged on and those only the stable's was."""
    rows = [(en_prompt(i), en_answer(i), zh_answer(i) if i == 5 else en_answer(i)) for i in range(100)]
    d = judge(shadow_of(rows), AnalysisSpec(), ShadowSpec(min_pairs=20))
    check = {c.name: c for c in d.checks}["off_language"]
    assert check.status == "pass" and "only the canary's in 1, only the stable's in 0" in check.detail, check.detail


def test_a_quiet_canary_is_told_apart_complete_or_cut_off() -> None:
    """The default still rolls back a canary at 0.3x the stable's length; its reason says whether its short
    answers were complete (a style a person may accept) or cut off mid-sentence."""
    def ev(texts: list[str], tokens: float, name: str) -> VersionEvidence:
        v = VersionEvidence(name, requests=len(texts), errors=0, bad_answers=0, finishes=len(texts),
                            length_finishes=0, completions=len(texts), completion_tokens_sum=tokens * len(texts),
                            empty=0)
        v.latency_s, v.completion_tokens = [0.5] * len(texts), [tokens] * len(texts)
        v.answers = [QualityAnswer(_request(en_prompt(i)), t, finish_reason="stop") for i, t in enumerate(texts)]
        return v
    stable = ev([en_answer(i) for i in range(40)], 60.0, "stable")
    for texts, said in (([f"Order A{i:04d} is refunded." for i in range(40)], "40 of its 40 answers end complete"),
                        ([f"Your order A{i:04d} will be refunded within five business days to the card you"
                          for i in range(40)], "40 cut off")):
        d = judge(Evidence(stable, ev(texts, 18.0, "canary"), 0.0, 30.0, "router", weight=50),
                  AnalysisSpec(min_requests=10))
        check = {c.name: c for c in d.checks}["completion_tokens"]
        assert check.status == "fail" and "goes quiet" in check.detail and said in check.detail, check.detail
