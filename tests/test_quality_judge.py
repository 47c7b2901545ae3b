"""The pairwise judge: order swapped, bounded, never charged to users, never a failure when it is down.
A small judge server scripts verdicts (and faults a real one will not give on demand: down, stalled); the
real-model case is SmolLM2 judging itself at the end."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from faults import ThreadedApp

from qlift.errors import BadInputError
from qlift.quality.judge import JudgeSettings, judge_pairs, parse_target, verdict
from qlift.rollout.shadow import Answer, Pair, ShadowEvidence, judge_shadow, judge_window
from qlift.rollout.spec import ShadowSpec


class ScriptedJudge(ThreadedApp):
    """Answers each judge call with ``rule(answer_a, answer_b)``; ``stall_s`` sleeps first."""

    def __init__(self, rule: Any, *, stall_s: float = 0.0, status: int = 200) -> None:
        self.rule, self.stall_s, self.status, self.calls = rule, stall_s, status, 0
        super().__init__()

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _chat(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = await request.json()
        if self.stall_s:
            await asyncio.sleep(self.stall_s)
        if self.status != 200:
            return web.json_response({"error": {"message": "down"}}, status=self.status)
        text = body["messages"][1]["content"]
        a = text.split("[Answer A]\n")[1].split("\n\n[Answer B]")[0]
        b = text.split("[Answer B]\n")[1].split("\n\nWhich answer")[0]
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": self.rule(a, b)}}]})


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
    d = judge_shadow(worse, spec)
    checks = {c.name: c for c in d.checks}
    assert d.action == "rollback" and checks["judge"].status == "fail" and checks["judge"].test == "sign", d.reason
    same = _evidence(16, "Order A{i:03d} is refunded.")
    with ScriptedJudge(lambda a, b: "A") as biased:  # always the first answer: position bias, no opinion
        spec = ShadowSpec(min_pairs=8, judge=f"{biased.url}#judge")
        same.judged = judge_window(same, spec)
        worse.judged = judge_window(worse, spec)
    for ev in (same, worse):
        assert ev.judged is not None and ev.judged.ties == ev.judged.swapped_disagreed == 16
        assert {c.name: c.status for c in judge_shadow(ev, spec).checks}["judge"] == "pass"


@pytest.mark.parametrize("fault", ["down", "stalled"])
def test_a_judge_that_is_down_or_slow_is_inconclusive_never_a_failure_never_a_hang(fault: str) -> None:
    ev = _evidence(12, "I don't know about order A{i:03d}.")
    judge = ScriptedJudge(_prefers_refunded, status=503) if fault == "down" else \
        ScriptedJudge(_prefers_refunded, stall_s=30)
    with judge:
        spec = ShadowSpec(min_pairs=8, judge=f"{judge.url}#judge", judge_timeout_s=1, judge_deadline_s=2)
        t0 = time.monotonic()
        ev.judged = judge_window(ev, spec)
        took = time.monotonic() - t0
    assert took < 5 and ev.judged is not None and ev.judged.judged == 0 and ev.judged.unjudged == 12
    d = judge_shadow(ev, spec)
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
