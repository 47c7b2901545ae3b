"""The memory planner against hand-computed figures, dtype rules, and --recipe auto.

The Qwen2.5-7B- and 3B-shaped models are real config.json files with header-only
safetensors files: the planner reads headers, never tensor data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from substrate import QWEN3B, QWEN7B, qwen2_tensors, write_header_only_safetensors

from qlift.errors import IncompatibleError
from qlift.hardware import simulate
from qlift.models.modeldir import ModelDir
from qlift.serve.plan import ModelShape, fit_to_model, plan_memory, resolve_dtype
from qlift.serve.recipes import apply_overrides, load_recipe
from qlift.serve.select import choose_recipe, mismatch

GiB = 1024**3


def shaped_model(root: Path, cfg: dict, *, quant_group: int | None = None, **extra: object) -> ModelDir:  # type: ignore[type-arg]
    """config.json + a header-only model.safetensors (offsets as if the data were there)."""
    root.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "bfloat16",
              "max_position_embeddings": 32768, "sliding_window": 131072, "use_sliding_window": False,
              "max_window_layers": cfg["num_hidden_layers"], **cfg, **extra}
    (root / "config.json").write_text(json.dumps(config))
    write_header_only_safetensors(root / "model.safetensors", qwen2_tensors(cfg, quant_group))
    return ModelDir.open(root)


@pytest.fixture
def q7b(tmp_path: Path) -> ModelDir:
    return shaped_model(tmp_path / "q7b", QWEN7B)


@pytest.fixture
def q3b(tmp_path: Path) -> ModelDir:
    return shaped_model(tmp_path / "q3b", QWEN3B)


def plan(md: ModelDir, recipe: str, gpu: str, count: int = 1, sets: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    r, _ = fit_to_model(apply_overrides(load_recipe(recipe), list(sets)), md)
    return plan_memory(md, r, simulate(gpu, count))


def test_parameter_counts_match_qwen25(q7b: ModelDir, q3b: ModelDir) -> None:
    assert q7b.parameter_count == 7_615_616_512  # Qwen2.5-7B: 7.61 B
    assert q3b.parameter_count == 3_085_938_688  # Qwen2.5-3B: 3.09 B (tied)


def test_7b_on_rtx4090(q7b: ModelDir) -> None:
    p = plan(q7b, "chat-4090", "RTX 4090")
    # 24 GiB x 0.90
    assert p.budget_bytes == 23_192_823_398
    # 7,615,616,512 params x 2 bytes
    assert p.weight_bytes == 15_231_233_024
    # the larger of the forward, 2048 tokens x (4 x 3584 + 3 x 18944) x 2 B, and the sampler, 256 x 152,064 x 4 B x 2
    assert p.activation_bytes == max(291_504_128, 311_427_072)
    # 28 layers x 4 KV heads x 128 head dim x 2 (K, V) x 2 B
    assert p.kv_bytes_per_token == 57_344
    # 23,192,823,398 - 15,231,233,024 - 311,427,072 - 0.22 GiB runtime (no CUDA graph allowance: vLLM 0.26 has none)
    assert p.cuda_graph_bytes == 0 and p.overhead_bytes == int(0.22 * GiB) == 236_223_201
    assert p.kv_cache_bytes == 7_413_940_101
    assert p.kv_capacity_tokens == 129_288
    assert p.concurrent_sequences == 15.78  # 7,413,940,101 / (8192 x 57,344)
    assert (p.verdict, p.dtype, p.max_model_len) == ("fits", "bfloat16", 8192)


def test_3b_on_rtx4090_and_t4(q3b: ModelDir) -> None:
    p = plan(q3b, "chat-4090", "RTX 4090")
    assert p.weight_bytes == 6_171_877_376
    # the larger of 2048 x (4 x 2048 + 3 x 11008) x 2 and 256 x 151,936 x 8
    assert p.activation_bytes == max(168_820_736, 311_164_928)
    assert p.kv_bytes_per_token == 36_864  # 36 x 2 x 128 x 2 x 2
    assert p.kv_cache_bytes == 23_192_823_398 - 6_171_877_376 - 311_164_928 - 236_223_201 == 16_473_557_893
    assert p.kv_capacity_tokens == 446_873
    t4 = plan(q3b, "chat-t4", "T4")
    assert t4.dtype == "float16" and t4.budget_bytes == 15_461_882_265  # 16 GiB x 0.90
    assert t4.kv_cache_bytes == 15_461_882_265 - 6_171_877_376 - 311_164_928 - 236_223_201 == 8_742_616_760
    assert t4.kv_capacity_tokens == 237_158
    assert t4.concurrent_sequences == 57.9  # / (4096 x 36,864)
    assert t4.verdict == "fits"


def test_7b_does_not_fit_a_t4(q7b: ModelDir) -> None:
    p = plan(q7b, "chat-t4", "T4")
    assert p.dtype == "float16" and p.weight_bytes == 15_231_233_024
    assert p.kv_cache_bytes == 15_461_882_265 - 15_231_233_024 - 311_427_072 - 236_223_201 < 0
    assert (p.verdict, p.largest_max_model_len) == ("does not fit", None)


def test_low_memory_gives_the_largest_max_model_len(q7b: ModelDir) -> None:
    p = plan(q7b, "chat-4090", "RTX 4090", sets=("gpu_memory_utilization=0.68", "max_model_len=32768"))
    # 24 GiB x 0.68 = 17,523,466,567; minus weights, activations, runtime
    assert p.kv_cache_bytes == 17_523_466_567 - 15_778_883_297 == 1_744_583_270
    assert p.kv_cache_bytes < 32768 * 57_344
    assert p.verdict == "low memory"
    assert p.largest_max_model_len == 30_208  # floor(1,744,583,270 / 57,344) = 30,423, to a multiple of 256


@pytest.mark.parametrize(("engine", "vllm_tokens"), [
    ({}, 2_115_440),  # vLLM's defaults: 1024 sequences, 8192 batched tokens (the sampler's peak is the larger)
    ({"max_model_len": 32768, "gpu_memory_utilization": 0.92, "max_num_seqs": 1024,
      "max_num_batched_tokens": 16384}, 2_096_192),  # chat-h200 (the forward pass's is)
])
def test_plan_within_1pct_of_the_recorded_h200_run(q7b: ModelDir, engine: dict[str, int | float],
                                                   vllm_tokens: int) -> None:
    """vLLM 0.26.0's "GPU KV cache size" on the lent H200 (benchmarks/results/h200-2026-12-01/kv-vs-plan.json)."""
    from qlift.serve.recipes import EngineSpec

    hw = simulate("H200")
    assert hw.gpus[0].memory_bytes == 150_754_820_096  # NVML's total on that H200 (plan-chat-h200.json)
    recipe = load_recipe("chat-h200")
    p = plan_memory(q7b, recipe.model_copy(update={"engine": EngineSpec(dtype="bfloat16", **engine)}), hw)
    assert p.kv_capacity_tokens == pytest.approx(vllm_tokens, rel=0.01)


def test_max_model_len_is_capped_at_the_models_context(q3b: ModelDir) -> None:
    r, notes = fit_to_model(apply_overrides(load_recipe("chat-h100"), ["max_model_len=131072"]), q3b)
    assert r.engine.max_model_len == 32768 and "131072" in notes[0]


def test_tensor_parallel_splits_weights_and_kv_heads(q7b: ModelDir) -> None:
    p = plan(q7b, "multi-tenant-a100x2", "A100-40GB", 2)
    assert p.tensor_parallel_size == 2
    assert p.weight_bytes == 15_231_233_024 // 2
    assert p.kv_bytes_per_token == 57_344 // 2
    assert p.overhead_bytes == int(0.22 * GiB) + int(0.25 * GiB)  # runtime + NCCL
    with pytest.raises(IncompatibleError, match="needs 2 GPUs"):
        plan(q7b, "multi-tenant-a100x2", "A100-40GB", 1)


def test_quantized_weights_count_at_stored_size(tmp_path: Path, q7b: ModelDir) -> None:
    md = shaped_model(tmp_path / "w4", QWEN7B, quant_group=128,
                      quantization_config={"quant_method": "compressed-tensors", "format": "pack-quantized"})
    expected = sum(t.nbytes for t in md.tensors.values())  # int4 packed + bf16 scales, embeddings bf16
    p = plan(md, "chat-t4", "T4")
    assert p.weight_bytes == expected
    assert 0.3 < expected / 15_231_233_024 < 0.4  # embeddings and lm_head stay bf16
    assert p.verdict == "fits"  # a 4-bit 7B fits the T4 that the bf16 one does not


def test_sliding_window_layers_hold_at_most_their_window() -> None:
    cfg = {**QWEN7B, "max_position_embeddings": 32768, "use_sliding_window": True, "sliding_window": 4096,
           "layer_types": ["sliding_attention", "full_attention"] * 14}
    shape = ModelShape.from_config(cfg)
    per_layer = 4 * 128 * 2 * 2
    assert shape.kv_bytes_for_sequence(32768, 2) == (14 * 32768 + 14 * 4096) * per_layer
    assert shape.kv_bytes_for_sequence(1000, 2) == 28 * 1000 * per_layer
    qwen_default = ModelShape.from_config({**QWEN7B, "use_sliding_window": False, "sliding_window": 4096})
    assert qwen_default.windows == (None,) * 28


@pytest.mark.parametrize("gpu", ["T4", "V100"])
def test_pre_ampere_gpus_get_float16(q3b: ModelDir, gpu: str) -> None:
    hw = simulate(gpu)
    choice = choose_recipe(hw, model=q3b)
    assert choice.recipe.engine.dtype == "float16"
    assert choice.plan is not None and choice.plan.dtype == "float16"
    assert resolve_dtype("auto", "bfloat16", hw) == "float16"
    with pytest.raises(IncompatibleError, match="compute capability 8.0"):
        resolve_dtype("bfloat16", "bfloat16", hw)


@pytest.mark.parametrize(("flags", "quantized", "recipe", "want"), [
    ({"avx2"}, False, None, "float32"),  # no bf16 units: bf16 maths is emulated, float32 serves 1.7x faster
    ({"avx2"}, False, "auto", "float32"),
    ({"avx2", "avx512f"}, False, None, "float32"),  # AVX-512 without BF16 emulates it too
    ({"avx2", "avx512f", "avx512_bf16"}, False, None, "bfloat16"),
    ({"avx2", "amx_tile"}, False, None, "bfloat16"),
    ({"avx2"}, True, None, "bfloat16"),  # a quantized checkpoint keeps its activation dtype
    ({"avx2"}, False, "bfloat16", "bfloat16"),  # asked for: kept (plan notes that it is slow)
])
def test_cpu_dtype_follows_the_cpus_bf16_units(flags: set[str], quantized: bool, recipe: str | None,
                                               want: str) -> None:
    from qlift.hardware import CpuInfo, Hardware

    cpu = CpuInfo("test CPU", 2, 8 << 30, avx512="avx512f" in flags, avx512_bf16="avx512_bf16" in flags,
                  amx="amx_tile" in flags, flags=frozenset(flags))
    assert resolve_dtype(recipe, "bfloat16", Hardware([], cpu, "none"), quantized=quantized) == want


@pytest.mark.parametrize(
    ("gpu", "count", "workload", "expected"),
    [
        ("RTX 4090", 1, "chat", "chat-4090"),
        ("T4", 1, "chat", "chat-t4"),
        ("V100-32GB", 1, "chat", "chat-v100"),
        ("A10G", 1, "chat", "chat-a10g"),
        ("L4", 1, "chat", "chat-l4"),
        ("A100-80GB", 1, "chat", "chat-a100-80g"),
        ("A100-40GB", 1, "long-doc", "long-doc-a100-40g"),
        ("A100-40GB", 2, "multi-tenant", "multi-tenant-a100x2"),
        ("A100-80GB", 2, "multi-tenant", "multi-tenant-a100x2"),
        ("H100", 1, "chat", "chat-h100"),
        ("H200", 1, "chat", "chat-h200"),
        ("H200", 4, "chat", "chat-h200"),
    ],
)
def test_auto_select_on_simulated_gpus(gpu: str, count: int, workload: str, expected: str) -> None:
    assert choose_recipe(simulate(gpu, count), workload=workload).recipe.name == expected


def test_auto_select_edges(q7b: ModelDir) -> None:
    assert mismatch(load_recipe("chat-l4"), simulate("L40S")) is not None  # \bL4\b is not L40S
    # No chat recipe for a 40 GiB A100: the one that suits it is used, and says so.
    choice = choose_recipe(simulate("A100-40GB"), workload="chat")
    assert choice.recipe.name == "long-doc-a100-40g" and "no chat recipe" in choice.reason
    choice = choose_recipe(simulate("T4"), model=q7b)
    assert choice.plan is not None and choice.plan.verdict == "does not fit"


def test_plan_cli(run_cli, q7b: ModelDir) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("plan", q7b.path, "--gpu", "RTX 4090", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["recipe"] == "chat-4090" and data["kv_capacity_tokens"] == 129_288
    res = run_cli("plan", q7b.path, "--recipe", "chat-4090", "--gpu", "RTX 4090",
                  "--set", "gpu_memory_utilization=0.68", "--set", "max_model_len=32768")
    assert "low memory (largest max_model_len that fits: 30,208)" in res.stdout
    res = run_cli("plan", q7b.path, "--recipe", "chat-4090", "--gpu", "T4")
    assert res.exit_code == 6 and "compute capability 8.0" in res.stderr
