"""The shadow judge on real answers: the qlift router mirrors live requests to the canary (users see only
the stable's answers), ShadowSource reads the pairs, the judge compares them prompt by prompt.

A canary that answers fast but wrong (every prompt answered as if it were another one: FaultProxy
rewrites the request) or rambles (ignore_eos) fails; a healthy canary passes. The recorded pairs of
the project's JSON fine-tune against its base show a deliberate change of style passing."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from faults import FaultProxy, RouterProcess, TinyBackend, run_load

from qlift.rollout.judge import judge
from qlift.rollout.shadow import Answer, Pair, ShadowEvidence, ShadowSource, wants_json
from qlift.rollout.spec import AnalysisSpec, ShadowSpec

TOKEN = "shadow-test-token"
RECORDED = Path(__file__).parent / "recorded" / "tickets-vs-base.json"
SPEC = ShadowSpec(min_pairs=12)


def _router(tmp_path: Path, stable_url: str, canary_url: str, model: str, canary_model: str | None = None
            ) -> RouterProcess:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return RouterProcess("--backend", f"stable={stable_url}#{model}",
                         "--backend", f"canary={canary_url}#{canary_model or model}",
                         "--weight", "stable=100", "--weight", "canary=0", "--public-model", "chat",
                         log_path=tmp_path / "router.log", token=TOKEN)


def _shadow_window(router: RouterProcess, *, requests: int, stream: bool, max_tokens: int) -> tuple[Any, Any]:
    source = ShadowSource(router.url, TOKEN, stable="stable")
    state = source.start("canary", 100, 4)
    assert state["shadow"]["version"] == "canary" and state["shadow"]["sent"] == 0
    source.begin()
    load = run_load(router.url, "chat", requests=requests, concurrency=2, stream=stream, max_tokens=max_tokens,
                    timeout_s=240)
    deadline = time.monotonic() + 60  # copies finish after the users' answers
    while len(source.peek().pairs) < requests and time.monotonic() < deadline:
        time.sleep(0.5)
    ev = source.collect()
    source.stop()
    return load, ev


def test_pairs_from_the_router_and_a_passing_twin(tmp_path: Path) -> None:
    """Plumbing on two identical tiny backends: every mirrored request is a pair, users see only stable."""
    with TinyBackend("m", tokens=8) as s, TinyBackend("m", tokens=8) as c, _router(tmp_path, s.url, c.url, "m") as r:
        load, ev = _shadow_window(r, requests=16, stream=True, max_tokens=8)
        assert load.errors == 0 and set(load.backends) == {"stable"}
        assert len(ev.pairs) == 16 and {p.shadow.backend for p in ev.pairs} == {"canary"}
        assert all(p.stream for p in ev.pairs)
        d = judge(ev, AnalysisSpec(), SPEC)
        assert d.action == "advance", d.reason
        checks = {c.name: c for c in d.checks}
        assert checks["agreement"].canary == pytest.approx(1.0) and checks["json_valid"].status == "skipped"


def test_the_prompt_asked_for_json() -> None:
    assert wants_json({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}})
    assert wants_json({"messages": [{"role": "system", "content": "Answer with JSON only."}]})
    assert wants_json({"prompt": "Return json please"})
    assert not wants_json({"messages": [{"role": "user", "content": "Tell me about Jason."}]})


def _pairs(stable: list[str], canary: list[str], *, json_prompt: bool = False) -> ShadowEvidence:
    ev = ShadowEvidence("s", "c")
    for i, (a, b) in enumerate(zip(stable, canary, strict=True)):
        req = {"messages": [{"role": "user", "content": f"prompt {i}" + (" as JSON" if json_prompt else "")}]}
        ev.pairs.append(Pair(i, req, Answer("s", 200, True, 1.0, text=a, finish_reason="stop", completion_tokens=9),
                             Answer("c", 200, True, 1.0, text=b, finish_reason="stop", completion_tokens=9)))
    return ev


def test_json_that_breaks_fails_and_too_few_pairs_hold() -> None:
    good = [json.dumps({"intent": "refund", "order_id": f"A{i:05d}"}) for i in range(20)]
    broken = [f"Sure! The intent is refund for order A{i:05d}." for i in range(20)]
    d = judge(_pairs(good, broken, json_prompt=True), AnalysisSpec(), SPEC)
    assert d.action == "rollback" and "json_valid" in d.reason
    assert judge(_pairs(good, good, json_prompt=True), AnalysisSpec(), SPEC).action == "advance"
    few = judge(_pairs(good[:5], good[:5]), AnalysisSpec(), SPEC)
    assert (few.action, few.verdict) == ("hold", "insufficient")


@pytest.mark.vllm
def test_fast_but_wrong_and_rambling_canaries_fail_a_healthy_one_passes(tmp_path: Path, smollm2_server: Any) -> None:
    """One real vLLM as the stable; the canary is the same server (a) answering another prompt than the
    one asked, (b) ignoring EOS, (c) as it is (a re-deploy of the same weights: healthy). (The session's
    random-LoRA canary is no healthy canary here: cut at max_tokens in 13 of 15 answers against 6 of 15.)"""
    base = smollm2_server.base_url
    spec = ShadowSpec(min_pairs=10)
    wrong_prompt = {"messages": [{"role": "user", "content": "Name three fruits and their colours."}]}
    with FaultProxy(base, body_patch=wrong_prompt) as wrong, _router(tmp_path / "a", base, wrong.url,
                                                                     "smollm2") as r:
        load, ev = _shadow_window(r, requests=12, stream=False, max_tokens=24)
        assert load.errors == 0 and set(load.backends) == {"stable"}  # no user saw a canary answer
        d = judge(ev, AnalysisSpec(), spec)
        # never advanced, and agreement is not shown (inconclusive, or, mixed up, failed) whichever check
        # speaks first: the answers about fruit are also all cut at max_tokens, where the stable's counts
        # to ten stop on their own in some windows and not in others
        agreement = {c.name: c for c in d.checks}["agreement"]
        assert d.action in ("hold", "rollback") and agreement.status in ("inconclusive", "fail"), d.reason
    with FaultProxy(base, body_patch={"ignore_eos": True}) as rambling, _router(tmp_path / "b", base, rambling.url,
                                                                                 "smollm2") as r:
        # room enough that the stable mostly stops on its own: the rambler is cut every time
        load, ev = _shadow_window(r, requests=12, stream=True, max_tokens=64)
        assert load.errors == 0 and set(load.backends) == {"stable"}
        d = judge(ev, AnalysisSpec(), spec)
        assert d.action == "rollback" and "finish_length" in d.reason, d.reason
    with FaultProxy(base) as twin, _router(tmp_path / "c", base, twin.url, "smollm2") as r:
        load, ev = _shadow_window(r, requests=12, stream=True, max_tokens=24)
        assert load.errors == 0 and set(load.backends) == {"stable"}
        d = judge(ev, AnalysisSpec(max_latency_ratio=3.0, max_ttft_ratio=3.0), spec)
        assert d.action == "advance", d.reason


@pytest.mark.skipif(not RECORDED.exists(), reason="run tests/recorded/record_tickets.py")
def test_a_deliberate_change_of_style_passes_the_shadow_phase() -> None:
    """examples/adapter answers support tickets in JSON; its base answers in prose. Word for word they
    agree little, but each JSON answer shares its own ticket's particulars with the base's answer."""
    data = json.loads(RECORDED.read_text())
    ev = ShadowEvidence("smollm2", "tickets", [
        Pair(p["seq"], p["request"], Answer.from_record(p["primary"]), Answer.from_record(p["shadow"]))
        for p in data["shadow_pairs"]])
    assert len(ev.pairs) >= 30
    d = judge(ev, AnalysisSpec(max_latency_ratio=3.0, max_ttft_ratio=3.0), ShadowSpec(min_pairs=20))
    checks = {c.name: c for c in d.checks}
    assert checks["json_valid"].status == "pass" and checks["agreement"].status == "pass", d.reason
    # prose to JSON on purpose: no answer check (loops, language, refusals, schemas) holds it against it
    assert {checks[n].status for n in ("loops", "off_language", "refusal", "schema_broken")} <= {"pass", "skipped"}
    assert d.action == "advance", d.reason
    # the same answers shifted by one ticket: JSON for another customer's ticket is no answer
    shifted = [Pair(p.seq, p.request, p.primary, ev.pairs[(i + 1) % len(ev.pairs)].shadow)
               for i, p in enumerate(ev.pairs)]
    wrong = judge(ShadowEvidence("smollm2", "tickets", shifted),
                  AnalysisSpec(max_latency_ratio=3.0, max_ttft_ratio=3.0), ShadowSpec(min_pairs=20))
    # ... but ROUGE-L shows no significant evidence against it either: it holds (the phase extends, then
    # pauses for a person), it never advances; a judge model (--judge) is what can tell
    assert wrong.action == "hold" and "agreement: " in wrong.reason and "not yet shown" in wrong.reason, wrong.reason


def test_an_agreement_that_only_leans_the_canarys_way_holds_then_passes_with_enough_pairs() -> None:
    """Absence of evidence is no evidence against the canary: ROUGE-L between prose and JSON is weak (the
    healthy examples/adapter read p = 0.08 at 39 live pairs), so once AGREEMENT_LEAN_PAIRS pairs lean to
    their own prompt with nothing significant either way, agreement passes; fewer hold."""
    def pairs(n: int) -> ShadowEvidence:
        stable = [f"Your order B{i:03d} will be refunded soon, thanks for waiting." for i in range(n)]
        canary = ['{"intent": "refund", "order": "B000"}'] + ['{"intent": "refund", "order": "unknown"}'] * (n - 1)
        return _pairs(stable, canary)

    few, enough = judge(pairs(15), AnalysisSpec(), SPEC), judge(pairs(24), AnalysisSpec(), SPEC)
    few_check = {c.name: c for c in few.checks}["agreement"]
    assert few.action == "hold" and few_check.status == "inconclusive" and few_check.p_value > 0.05
    check = {c.name: c for c in enough.checks}["agreement"]
    assert enough.action == "advance" and check.status == "pass" and "leans to its own prompt" in check.detail


def test_a_shadow_phase_asks_the_planes_declared_capabilities(tmp_path: Path) -> None:
    """Mirroring is a capability a data plane declares: the spec refuses a shadow phase on a plane that does not
    declare it, and the controller's mirror comes from the plane (none where it declares none, whatever its kind)."""
    from pydantic import ValidationError

    from qlift.rollout.dataplane import RouterDataPlane, mirror_source
    from qlift.rollout.planes import PLANES, Capability
    from qlift.rollout.spec import RolloutSpec

    assert [name for name, p in PLANES.items() if Capability.MIRROR in p.capabilities] == ["builtin"]
    with pytest.raises(ValidationError, match="a shadow phase needs the qlift router"):
        RolloutSpec.model_validate({"stable": "s", "canary": "c", "data_plane": "nginx", "shadow": {"percent": 20},
                                    "nginx": {"prefix": str(tmp_path), "listen": "127.0.0.1:18080"},
                                    "backends": {"s": "http://127.0.0.1:1", "c": "http://127.0.0.1:2"}})
    spec = RolloutSpec.model_validate({"stable": "s", "canary": "c", "router": "http://127.0.0.1:1",
                                       "shadow": {"percent": 20}})
    mirror = mirror_source(RouterDataPlane("http://127.0.0.1:1", TOKEN), spec)
    assert mirror is not None and (mirror.stable, mirror.canary) == ("s", "c")
    assert mirror_source(RouterDataPlane("http://127.0.0.1:1", TOKEN), spec.model_copy(update={"shadow": None})) is None

    class NoMirror(RouterDataPlane):
        capabilities = frozenset[Capability]()

    assert mirror_source(NoMirror("http://127.0.0.1:1", TOKEN), spec) is None
