"""The memory plan at tensor_parallel_size 2 (Qwen2.5-14B and 32B shapes, header-only safetensors), against
hand-computed figures and vLLM 0.26.0's own KV cache arithmetic; and the TP choice of --recipe auto."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_plan import shaped_model

from qlift.errors import IncompatibleError
from qlift.hardware import simulate
from qlift.models.modeldir import ModelDir
from qlift.serve.plan import BATCH_SEQ_TOKENS, MemoryPlan, fit_tensor_parallel, fit_to_model, plan_memory
from qlift.serve.recipes import apply_overrides, load_recipe
from qlift.serve.select import choose_recipe

GiB = 1024**3
QWEN14B = {"hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
           "intermediate_size": 13824, "vocab_size": 152064, "tie_word_embeddings": False}
QWEN32B = {**QWEN14B, "num_hidden_layers": 64, "intermediate_size": 27648}


@pytest.fixture(scope="module")
def q14b(tmp_path_factory: pytest.TempPathFactory) -> ModelDir:
    return shaped_model(tmp_path_factory.mktemp("m") / "q14b", QWEN14B)


@pytest.fixture(scope="module")
def q32b(tmp_path_factory: pytest.TempPathFactory) -> ModelDir:
    return shaped_model(tmp_path_factory.mktemp("m") / "q32b", QWEN32B)


def plan(md: ModelDir, recipe: str, gpu: str, count: int, *sets: str) -> MemoryPlan:
    r, _ = fit_to_model(apply_overrides(load_recipe(recipe), list(sets)), md)
    return plan_memory(md, r, simulate(gpu, count))


def test_32b_at_tp2_on_two_h100s_by_hand(q32b: ModelDir) -> None:
    p = plan(q32b, "chat-h100", "H100", 2, "tensor_parallel_size=2")
    assert q32b.parameter_count == 32_763_876_352  # Qwen2.5-32B: 32.76 B
    assert p.weight_bytes == 32_763_876_352 * 2 // 2
    # 64 layers x 8/2 KV heads x 128 x 2 (K, V) x 2 B
    assert p.kv_bytes_per_token == 131_072
    # the forward over chat-h100's 16384 batched tokens, x (4 x 5120 + 3 x 27648/2) x 2 B, outweighs the sampler's
    # 1024 seqs x 152,064 x 4 B x 2: vLLM profiles them one after the other
    forward, sampler = 16384 * (4 * 5120 + 3 * 27648 // 2) * 2, 1024 * 152_064 * 8
    assert p.activation_bytes == forward == 2_030_043_136 > sampler
    assert p.cuda_graph_bytes == 0 and p.overhead_bytes == int(0.22 * GiB) + int(0.25 * GiB)  # runtime + NCCL
    kv = int(80 * GiB * 0.92) - p.weight_bytes - forward - int(0.22 * GiB) - int(0.25 * GiB)
    assert p.kv_cache_bytes == kv
    assert p.kv_capacity_tokens == kv // 131_072 == 333_624
    assert p.concurrent_sequences == round(kv / (32768 * 131_072), 2) == 10.18
    assert p.verdict == "fits"


def test_tp2_holds_twice_the_tokens_of_tp1_in_the_same_kv_memory(q14b: ModelDir) -> None:
    fixed = f"kv_cache_memory_bytes={20 * GiB}"  # the same KV memory at both sizes
    one = plan(q14b, "chat-h200", "H200", 2, fixed)
    two = plan(q14b, "chat-h200", "H200", 2, fixed, "tensor_parallel_size=2")
    assert one.kv_cache_bytes == two.kv_cache_bytes == 20 * GiB
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token == 48 * 8 * 128 * 2 * 2
    assert two.kv_capacity_tokens in (2 * one.kv_capacity_tokens, 2 * one.kv_capacity_tokens + 1)
    assert two.concurrent_sequences == pytest.approx(2 * one.concurrent_sequences, abs=0.01)


def test_plan_matches_vllm_026_block_arithmetic_at_tp2(q32b: ModelDir) -> None:
    """vLLM 0.26: blocks = available // page // layers, page = 2 x 16 x kv_heads/TP x head_dim x 2 B;
    'GPU KV cache size' = blocks x 16; 'Maximum concurrency' = blocks / ceil(max_model_len / 16)."""
    p = plan(q32b, "chat-h200", "H200", 2, "tensor_parallel_size=2")
    page = 2 * 16 * (8 // 2) * 128 * 2
    blocks = p.kv_cache_bytes // page // 64
    assert blocks * 16 <= p.kv_capacity_tokens < blocks * 16 + 16
    assert p.concurrent_sequences == pytest.approx(blocks / (32768 // 16), abs=0.01)


def test_auto_picks_tp2_for_the_32b_on_two_h100s(q32b: ModelDir) -> None:
    hw = simulate("H100", 2)
    choice = choose_recipe(hw, model=q32b)
    assert choice.recipe.name == "chat-h100"
    one = plan(q32b, "chat-h100", "H100", 2)
    assert one.fits and one.kv_capacity_tokens < one.max_num_seqs * BATCH_SEQ_TOKENS  # fits, but not its batch
    recipe, notes = fit_tensor_parallel(choice.recipe, q32b, hw)
    assert (recipe.tensor_parallel_size, recipe.hardware.gpu_count) == (2, 2)
    assert "tensor_parallel_size 2" in notes[0] and "333,624 tokens each" in notes[0]


def test_auto_keeps_tp1_where_one_gpu_holds_the_batch(q14b: ModelDir) -> None:
    recipe, notes = fit_tensor_parallel(load_recipe("chat-h200"), q14b, simulate("H200", 2))
    assert recipe.tensor_parallel_size == 1 and notes == []


def test_auto_on_one_gpu_says_how_many_it_would_need(q32b: ModelDir) -> None:
    recipe, notes = fit_tensor_parallel(load_recipe("chat-h100"), q32b, simulate("H100", 1))
    assert recipe.tensor_parallel_size == 1
    assert "tensor_parallel_size 2 (2 GPUs) would hold it, this machine has 1 GPU" in notes[0]


def test_a_recipe_that_sets_tp_keeps_it(q14b: ModelDir) -> None:
    recipe = load_recipe("multi-tenant-a100x2")
    assert fit_tensor_parallel(recipe, q14b, simulate("A100-80GB", 4)) == (recipe, [])


def test_set_tp2_needs_two_gpus(q32b: ModelDir) -> None:
    assert apply_overrides(load_recipe("chat-h100"), ["tensor_parallel_size=2"]).hardware.gpu_count == 2
    with pytest.raises(IncompatibleError, match="needs 2 GPUs .* has 1"):
        plan(q32b, "chat-h100", "H100", 1, "tensor_parallel_size=2")


def test_kv_heads_that_tp_cannot_split_are_refused(tmp_path: Path) -> None:
    md = shaped_model(tmp_path / "odd", {**QWEN14B, "num_hidden_layers": 2, "num_attention_heads": 40,
                                         "num_key_value_heads": 10})
    with pytest.raises(IncompatibleError, match="10 KV heads cannot be split over tensor_parallel_size 4"):
        plan(md, "chat-h100", "H100", 4, "tensor_parallel_size=4")
    assert plan(md, "chat-h100", "H100", 2, "tensor_parallel_size=2").kv_bytes_per_token == 2 * 5 * 128 * 2 * 2


def test_serve_recipe_auto_plans_tp2_for_the_32b_on_two_h100s(q32b: ModelDir, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from qlift.models.ref import ModelRef
    from qlift.serve.launch import plan_launch

    monkeypatch.setenv("QLIFT_HOME", str(tmp_path))  # the FP8-KV gate finds no report here
    two = plan_launch(ModelRef.at(q32b.path), recipe="auto", hardware=simulate("H100", 2))
    assert two.recipe.tensor_parallel_size == 2 and two.memory.tensor_parallel_size == 2 and two.memory.fits
    assert any("tensor_parallel_size 2" in n for n in two.notes)
    one = plan_launch(ModelRef.at(q32b.path), recipe="auto", hardware=simulate("H100", 1))
    assert one.recipe.tensor_parallel_size == 1
    assert any("this machine has 1 GPU" in n for n in one.notes)
