"""The pairwise judge: order swapped, bounded, never charged to users, never a failure when it is down.
A small judge server scripts verdicts (and faults a real one will not give on demand: down, stalled); the
real-model case is SmolLM2 judging itself at the end."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from faults import ScriptedJudge

from qlift.errors import BadInputError
from qlift.quality.judge import JudgeSettings, judge_pairs, parse_target, verdict
from qlift.rollout.judge import judge
from qlift.rollout.shadow import Answer, Pair, ShadowEvidence, judge_window
from qlift.rollout.spec import AnalysisSpec, ShadowSpec


def _evidence(n: int, canary: str) -> ShadowEvidence:
    ev = ShadowEvidence("s", "c")
    for i in range(n):
        req = {"messages": [{"role": "user", "content": f"Refund order A{i:03d}?"}]}
        ev.pairs.append(Pair(i, req, Answer("s", 200, True, 1.0, text=f"Order A{i:03d} is refunded.",
                                            finish_reason="stop", completion_tokens=5),
                             Answer("c", 200, True, 1.0, text=canary.format(i=i), finish_reason="stop",
                                    completion_tokens=5)))
    return ev


def _prefers_refunded(a: str, b: str) -> str:
    return "A" if "refunded" in a and "refunded" not in b else "B" if "refunded" in b and "refunded" not in a else "T"


def test_targets_and_verdicts_parse_or_fail_in_one_line() -> None:
    assert parse_target("http://127.0.0.1:8001/v1#smollm2") == ("http://127.0.0.1:8001", "smollm2")
    with pytest.raises(BadInputError, match="URL#MODEL"):
        parse_target("smollm2")
    assert [verdict(t) for t in ("A", " b.", "T", "Tie", "Answer A", "")] == ["A", "B", "T", "T", None, None]
    with pytest.raises(ValueError, match="URL#MODEL"):
        ShadowSpec(judge="no-url")


def test_a_worse_canary_is_rolled_back_on_the_judge_and_a_position_biased_judge_gives_ties() -> None:
    worse = _evidence(16, "I don't know about order A{i:03d}.")
    with ScriptedJudge(_prefers_refunded) as j:
        spec = ShadowSpec(min_pairs=8, judge=f"{j.url}#judge", judge_pairs=16)
        worse.judged = judge_window(worse, spec)
    assert worse.judged is not None and (worse.judged.losses, worse.judged.wins, worse.judged.ties) == (16, 0, 0)
    assert j.calls == 32  # each pair twice, order swapped
    d = judge(worse, AnalysisSpec(), spec)
    checks = {c.name: c for c in d.checks}
    assert d.action == "rollback" and checks["judge"].status == "fail" and checks["judge"].test == "sign", d.reason
    same = _evidence(16, "Order A{i:03d} is refunded.")
    with ScriptedJudge(lambda a, b: "A") as biased:  # always the first answer: position bias, no opinion
        spec = ShadowSpec(min_pairs=8, judge=f"{biased.url}#judge")
        same.judged = judge_window(same, spec)
        worse.judged = judge_window(worse, spec)
    for ev in (same, worse):
        assert ev.judged is not None and ev.judged.ties == ev.judged.swapped_disagreed == 16
        assert {c.name: c.status for c in judge(ev, AnalysisSpec(), spec).checks}["judge"] == "pass"


@pytest.mark.parametrize("fault", ["down", "stalled"])
def test_a_judge_that_is_down_or_slow_is_inconclusive_never_a_failure_never_a_hang(fault: str) -> None:
    ev = _evidence(12, "I don't know about order A{i:03d}.")
    scripted = ScriptedJudge(_prefers_refunded, status=503) if fault == "down" else \
        ScriptedJudge(_prefers_refunded, stall_s=30)
    with scripted:
        spec = ShadowSpec(min_pairs=8, judge=f"{scripted.url}#judge", judge_timeout_s=1, judge_deadline_s=2)
        t0 = time.monotonic()
        ev.judged = judge_window(ev, spec)
        took = time.monotonic() - t0
    assert took < 5 and ev.judged is not None and ev.judged.judged == 0 and ev.judged.unjudged == 12
    d = judge(ev, AnalysisSpec(), spec)
    check = {c.name: c for c in d.checks}["judge"]
    assert check.status == "inconclusive" and d.action == "hold", d.reason


def test_the_shadow_summary_carries_the_judges_shares_with_intervals(tmp_path: Path) -> None:
    ev = _evidence(10, "I don't know.")
    with ScriptedJudge(_prefers_refunded) as j:
        ev.judged = judge_window(ev, ShadowSpec(judge=f"{j.url}#judge"))
    s = json.loads(json.dumps(ev.summary()))["judge"]
    assert s["losses"] == 10 and s["losses_share"] == 1.0 and s["losses_ci95"][0] > 0.6 and s["calls"] == 20
    merged = ev.merged(ev)
    assert merged.judged is not None and merged.judged.losses == 20


@pytest.mark.vllm
def test_smollm2_judging_is_position_bias_that_swapping_turns_into_ties(smollm2_server: Any) -> None:
    """A real, weak judge: SmolLM2 mostly names the same letter whichever answer is first, so asked twice with
    the order swapped its verdicts disagree, and a clearly worse canary is not called worse on its word."""
    url, model = smollm2_server.base_url, smollm2_server.served_model_name
    triples = [(f"What is {i} plus {i}?", f"{i} plus {i} is {2 * i}.", "I like turtles.") for i in range(1, 9)]
    r = judge_pairs(triples, JudgeSettings(url, model, pairs=8, concurrency=2, timeout_s=60, deadline_s=120))
    assert r.judged + r.unjudged == 8 and r.calls >= 2 * r.judged
    assert r.ties >= r.judged // 2, r.summary()  # position bias -> ties, not a verdict
    assert r.swapped_disagreed >= 1, r.summary()


class PairScript:
    """The router's pairs as the controller reads them (ShadowSource's seam): the shadow phase's windows get
    ``shadow_answer`` pairs, split windows (mirroring with a partner) ``split_answer`` pairs."""

    def __init__(self, shadow_answer: str, split_answer: str) -> None:
        self.answers = {None: shadow_answer, "s": split_answer}
        self.started: list[str | None] = []
        self.stops = 0

    def start(self, version: str, percent: float, max_inflight: int, *, partner: str | None = None) -> dict:
        self.started.append(partner)
        return {}

    def stop(self) -> None:
        self.stops += 1

    def begin(self) -> None:
        pass

    def collect(self) -> ShadowEvidence:
        return _evidence(12, self.answers[self.started[-1]])


def test_the_controller_judges_split_windows_on_pairs_both_versions_answer(tmp_path: Path) -> None:
    from test_rollout_journal import MemoryPlane, ScriptedEvidence, healthy
    from test_rollout_state import FakeClock

    from qlift.rollout.controller import Controller, Pace
    from qlift.rollout.journal import Journal
    from qlift.rollout.spec import RolloutSpec
    from qlift.rollout.states import State

    with ScriptedJudge(_prefers_refunded) as j:
        sp = RolloutSpec.model_validate({
            "stable": "s", "canary": "c", "router": "http://127.0.0.1:1", "interval": "30s", "steps": [50, 100],
            "analysis": {"min_requests": 5}, "shadow": {"windows": 1, "min_pairs": 8, "judge": f"{j.url}#judge"}})
        journal, clock = Journal(tmp_path / "j.sqlite"), FakeClock()
        r = journal.create(sp.model_dump(mode="json"), sp.stable, sp.canary, state=State.SHADOWING)
        pairs = PairScript("Order A{i:03d} is refunded.", "I don't know about order A{i:03d}.")
        final = Controller(journal, r.id, sp, MemoryPlane(), ScriptedEvidence([(healthy("c", 20), healthy("s", 20))]),
                           pace=Pace(sleep=clock.sleep, clock=clock.time), shadow_source=pairs).run()
    assert final.state == "rolled_back", final.reason
    assert pairs.started == [None, "s"] and pairs.stops >= 2  # the split window's sample on with a partner, then off
    windows = journal.history(r.id)["windows"]
    split = [w for w in windows if w["step"] == 0][0]
    judge = next(c for c in split["checks"] if c["name"] == "judge")
    assert judge["status"] == "fail" and "stable better in 12 of 12" in judge["detail"], judge
    assert "judge:" in final.reason
