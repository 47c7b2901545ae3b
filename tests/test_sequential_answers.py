"""Answer checks end a split window early (issue 52, shorter exposure): the looks at a window in progress spend a
quarter of each answer check's level (alpha spending, t squared), the window's end the rest, so a canary that
refuses 70% of prompts is rolled back at its first look while the level over a whole window stays alpha."""

from __future__ import annotations

import random

import pytest

from qlift.quality.registry import Answer
from qlift.rollout.answer_checks import LOOKS_SHARE, look_share
from qlift.rollout.check_types import Look
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.judge import early_failures, judge
from qlift.rollout.spec import AnalysisSpec

ANSWER = "Your order {o} will be refunded within five business days, and the money returns to your card."
REFUSAL = "I'm sorry, but I can't help with that request."


def _version(name: str, n: int, bad_share: float, seed: int) -> VersionEvidence:
    rng = random.Random(seed)
    answers = [Answer({"prompt": f"Please refund my order A{i:04d}. It arrived broken."},
                      REFUSAL if rng.random() < bad_share else ANSWER.format(o=f"A{i:04d}"), finish_reason="stop")
               for i in range(n)]
    return VersionEvidence(name, requests=n, errors=0, bad_answers=0, answers=answers)


def _evidence(canary_n: int, bad_share: float, seed: int = 0, stable_share: float = 0.0) -> Evidence:
    return Evidence(_version("stable", 9 * canary_n, stable_share, seed + 1),
                    _version("canary", canary_n, bad_share, seed), 0.0, 30.0, "router", weight=10)


@pytest.mark.parametrize("seed", range(5))
def test_the_looks_and_the_end_never_spend_more_than_the_level(seed: int) -> None:
    rng = random.Random(seed)
    times = sorted(rng.random() for _ in range(rng.randint(1, 60)))
    spent = sum(look_share(Look(a, b), True) for a, b in zip([0.0, *times], times, strict=False))
    assert 0 < spent <= LOOKS_SHARE + 1e-12
    assert spent + look_share(None, True) <= 1 + 1e-12
    # off: no look spends anything, the end spends it all (the judge before sequential looks)
    assert look_share(Look(0.0, 0.5), False) == 0.0 and look_share(None, False) == 1.0


def test_a_canary_refusing_most_prompts_ends_the_window_at_its_first_look() -> None:
    ev = _evidence(20, 0.7)
    assert "refusal" in [c.name for c in early_failures(ev, AnalysisSpec(), Look(0.0, 0.25))]
    # with the looks off, only the window's end judges it
    assert early_failures(ev, AnalysisSpec(early_answer_checks=False), Look(0.0, 0.25)) == []
    d = judge(ev, AnalysisSpec())
    assert d.action == "rollback" and "refusal" in {c.name for c in d.checks if c.status == "fail"}, d.reason


def test_a_look_spends_only_the_growth_since_the_last_one() -> None:
    """A canary that refuses 30% against a stable's 10% is significant at the window's end but not at a look
    spending a sliver of the level: a look right after another tests at almost nothing."""
    ev = _evidence(120, 0.3, seed=3, stable_share=0.1)
    assert early_failures(ev, AnalysisSpec(), Look(0.5, 0.5001)) == []
    assert "refusal" in {c.name for c in judge(ev, AnalysisSpec()).checks if c.status == "fail"}


def test_a_healthy_canary_is_never_stopped_by_a_look() -> None:
    """Both versions refuse 10% of prompts: 10 looks over a window find nothing, in 10 windows."""
    for seed in range(10):
        ev = _evidence(30, 0.1, seed=seed * 7, stable_share=0.1)
        looks = [i / 10 for i in range(11)]
        assert all(early_failures(ev, AnalysisSpec(), Look(a, b)) == [] for a, b in zip(looks, looks[1:],
                                                                                         strict=False)), seed
