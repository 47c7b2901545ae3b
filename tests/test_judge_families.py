"""Every failure family in every disguise is rolled back by the judge, and every healthy style passes it (issue 52).

The cases are ``tests/judge_families.py``'s: 9 families x 5 disguises, broken tool calls x 6, 9 healthy styles of
the same content, over a deck of six languages. Here each case's answers to the deck are judged as one split window
(the canary's sampled answers against the stable's) and one shadow window (pairs), the way the router's request
log and shadow pairs feed the judge; `benchmarks/judge_families.py` runs the same cases through the real router and
`qlift promote start` (the table in docs/promote-checks.md).
"""

from __future__ import annotations

import json

import pytest
from judge_families import Case, Prompt, cases, deck, stable_reply

from qlift.quality.registry import ANSWER_METRICS
from qlift.quality.registry import Answer as Sample
from qlift.quality.toolcalls import calls_of
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.judge import judge
from qlift.rollout.shadow import Answer, Pair, ShadowEvidence
from qlift.rollout.spec import AnalysisSpec, ShadowSpec

CASES = cases()
# the deck, with more tool-call prompts: a window sees as many as a tool-using service's would
DECK = deck(6) + [p for p in deck(24)[66:] if p.kind == "tool"]
ANSWER_CHECKS = {m.name for m in ANSWER_METRICS}


def _request(p: Prompt) -> dict[str, object]:
    return {**p.body, "prompt": str(p.body["messages"][-1]["content"])}  # type: ignore[index]


def _version(name: str, replies: list[tuple[Prompt, tuple[str, str, list[dict[str, object]] | None]]]
             ) -> VersionEvidence:
    answers = [Sample(_request(p), text, finish_reason=finish, tool_calls=calls_of(calls))
               for p, (text, finish, calls) in replies]
    n = len(answers)
    return VersionEvidence(name, requests=n, errors=0, bad_answers=0, answers=answers, finishes=n, length_finishes=0)


def _split(case: Case) -> Evidence:
    stable = [(p, stable_reply(p)) for p in DECK * 3]
    canary = [(p, case.answer(p.body)) for p in DECK]
    return Evidence(_version("stable", stable), _version("canary", canary), 0.0, 30.0, "router", weight=25)


def _side(name: str, reply: tuple[str, str, list[dict[str, object]] | None]) -> Answer:
    text, finish, calls = reply
    return Answer(name, 200, True, 1.0, ttft_s=0.1, text=text, finish_reason=finish,
                  completion_tokens=max(1, len(text) // 4), tool_calls=calls_of(calls))


def _shadow(case: Case) -> ShadowEvidence:
    ev = ShadowEvidence("stable", "canary")
    for i, p in enumerate(DECK):
        ev.pairs.append(Pair(i, json.loads(json.dumps(p.body)), _side("stable", stable_reply(p)),
                             _side("canary", case.answer(p.body))))
    return ev


def _failed(d: object) -> set[str]:
    return {c.name for c in d.checks if c.status == "fail"}  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_disguise_is_rolled_back_and_each_healthy_style_passes_a_split_window(case: Case) -> None:
    d = judge(_split(case), AnalysisSpec(min_requests=10))
    failed = _failed(d) & ANSWER_CHECKS
    if case.healthy:
        assert not failed, (case.name, d.reason)
    else:
        assert failed, (case.name, [(c.name, c.status, c.detail) for c in d.checks if c.name in ANSWER_CHECKS])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_disguise_is_rolled_back_and_each_healthy_style_passes_the_shadow_phase(case: Case) -> None:
    shadow = ShadowSpec(percent=30, min_pairs=10)
    d = judge(_shadow(case), AnalysisSpec(min_requests=10), shadow)
    failed = _failed(d) - {"agreement"} if case.healthy else _failed(d)
    if case.healthy:
        assert not failed, (case.name, d.reason)
    else:
        assert failed, (case.name, [(c.name, c.status, c.detail) for c in d.checks])


def test_the_generator_covers_eight_families_in_five_disguises_and_twelve_healthy_kinds_of_text() -> None:
    bad = [c for c in CASES if not c.healthy]
    families = {c.family for c in bad}
    assert len(families) >= 8 and all(sum(c.family == f for c in bad) >= 5 for f in families)
    assert len({c.disguise for c in CASES if c.healthy}) >= 8
    # the deck speaks six languages and asks for prose, JSON and tool calls
    assert {p.lang for p in DECK} >= {"en", "zh", "es", "ru", "ja", "ko"}
    assert {p.kind for p in DECK} == {"refund", "error", "json", "tool"}
    # a disguise changes what the canary says, never the request: every canary answer differs from the stable's
    # on some prompt, and the healthy "same" style is the stable itself
    for c in CASES:
        changed = sum(c.answer(p.body) != stable_reply(p) for p in DECK)
        assert changed == 0 if c.disguise == "same" else changed > 0, c.name
