"""W4A16 checkpoints unpacked to float weights for vLLM on CPUs without its W4A16 kernel (qlift.quantize.unpack),
and the eval's choice of that path (qlift.eval.vllm_backend.VllmBackend.route)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from qlift.eval.generation import EvalModel
from qlift.hardware import detect_cpu
from qlift.lineage import read_manifest, utc_now, write_manifest
from qlift.models.ref import ModelRef
from qlift.quantize import unpack
from qlift.quantize.unpack import ensure_unpacked, packed_scheme

REPO = Path(__file__).resolve().parents[1]
W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
         "config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized", "input_activations": None,
                                       "weights": {"num_bits": 4, "type": "int", "symmetric": False,
                                                   "strategy": "group", "group_size": 12}}}}
ROWS, COLS, GROUP = 10, 36, 12  # 10 rows: the zero points' last word is half padding; 36 columns: the weights' too


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("QLIFT_EVAL_CACHE", str(tmp_path / "eval-cache"))


def pack(values: list[list[int]], along_rows: bool = False) -> torch.Tensor:
    """Signed 4-bit ints, 8 to an int32 word, lowest nibble first, offset by 8 (by hand, as the format says)."""
    grid = [list(r) for r in zip(*values, strict=True)] if along_rows else values
    words = []
    for row in grid:
        out = []
        for start in range(0, len(row), 8):
            word = sum(((v + 8) & 0xF) << (4 * i) for i, v in enumerate(row[start:start + 8]))
            out.append(word - (1 << 32) if word >= 1 << 31 else word)
        words.append(out)
    t = torch.tensor(words, dtype=torch.int32)
    return t.T.contiguous() if along_rows else t


def ints(rows: int, cols: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 8, (rows, cols), generator=g).tolist()


def by_hand(q: list[list[int]], zero: list[list[int]], scale: torch.Tensor, group_of: list[int]) -> torch.Tensor:
    s = scale.float().tolist()
    return torch.tensor([[(q[r][c] - zero[r][group_of[c]]) * s[r][group_of[c]] for c in range(COLS)]
                         for r in range(ROWS)], dtype=torch.float32)


@pytest.fixture
def packed_model(tmp_path: Path) -> dict[str, Any]:
    """Two shards: q_proj (asymmetric, groups of 12 columns; its scale in the other shard), k_proj (act-order g_idx),
    an embedding and a norm; a tokenizer file, llm-compressor's recipe and a quantize manifest beside."""
    src = tmp_path / "awq"
    src.mkdir()
    scale = (torch.rand(ROWS, COLS // GROUP, generator=torch.Generator().manual_seed(3)) / 10 + 0.01).bfloat16()
    q, zero = ints(ROWS, COLS, 1), ints(ROWS, COLS // GROUP, 2)
    k, kzero = ints(ROWS, COLS, 4), ints(ROWS, COLS // GROUP, 5)
    g_idx = torch.randperm(COLS, generator=torch.Generator().manual_seed(6)) % (COLS // GROUP)
    want = {"model.layers.0.self_attn.q_proj.weight": by_hand(q, zero, scale, [c // GROUP for c in range(COLS)]),
            "model.layers.0.self_attn.k_proj.weight": by_hand(k, kzero, scale, g_idx.tolist())}
    embed = torch.randn(16, COLS, generator=torch.Generator().manual_seed(7)).bfloat16()
    first = {"model.embed_tokens.weight": embed,
             "model.layers.0.self_attn.q_proj.weight_packed": pack(q),
             "model.layers.0.self_attn.q_proj.weight_zero_point": pack(zero, along_rows=True),
             "model.layers.0.self_attn.q_proj.weight_shape": torch.tensor([ROWS, COLS])}
    second = {"model.layers.0.self_attn.q_proj.weight_scale": scale, "model.norm.weight": torch.ones(COLS).bfloat16(),
              "model.layers.0.self_attn.k_proj.weight_packed": pack(k),
              "model.layers.0.self_attn.k_proj.weight_scale": scale.clone(),
              "model.layers.0.self_attn.k_proj.weight_zero_point": pack(kzero, along_rows=True),
              "model.layers.0.self_attn.k_proj.weight_g_idx": g_idx.to(torch.int32),
              "model.layers.0.self_attn.k_proj.weight_shape": torch.tensor([ROWS, COLS])}
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    for name, tensors in shards.items():
        save_file(tensors, str(src / name), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {t: n for n, ts in shards.items() for t in ts}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": COLS, "vocab_size": 16,
              "dtype": "bfloat16", "quantization_config": W4A16}
    (src / "config.json").write_text(json.dumps(config))
    (src / "tokenizer.json").write_text("{}")
    (src / "recipe.yaml").write_text("quant_stage: {}\n")
    write_manifest(src, operation="quantize", inputs={}, parameters={"method": "awq"}, started_at=utc_now())
    return {"path": src, "want": want, "embed": embed}


def read(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})  # noqa: SIM118 (safe_open is no dict)
    return out


def test_unpacked_weights_are_the_hand_dequantized_int4_values(packed_model: dict[str, Any]) -> None:
    src = packed_model["path"]
    ref = ModelRef.of(src)
    out = ensure_unpacked(ref, dtype="float32")
    got = read(out)
    assert sorted(got) == sorted([*packed_model["want"], "model.embed_tokens.weight", "model.norm.weight"])
    for name, want in packed_model["want"].items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], want), name
    assert torch.equal(got["model.embed_tokens.weight"], packed_model["embed"].float())

    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["model.layers.0.self_attn.q_proj.weight"] == "model-00001-of-00002.safetensors"
    assert (out / "tokenizer.json").is_file() and not (out / "recipe.yaml").exists()

    manifest = read_manifest(out)
    assert manifest is not None and manifest["operation"] == "unpack"
    assert manifest["inputs"] == [{"role": "model", "path": str(src.resolve()), "content_hash": ref.content_hash}]
    assert manifest["parameters"]["unpacked_from"] == "W4A16 (pack-quantized)"
    assert manifest["parameters"]["note"].startswith("unpacked from W4A16")
    assert manifest["parents"]["model"]["operation"] == "quantize"  # the lineage goes on to the AWQ run
    assert out.parent.name == "unpacked" and out.name.startswith(ref.content_hash.removeprefix("sha256:")[:16])

    bf16 = read(ensure_unpacked(ref, dtype="bfloat16"))  # compressed-tensors' own result: the product in bf16
    assert torch.equal(bf16["model.layers.0.self_attn.k_proj.weight"],
                       packed_model["want"]["model.layers.0.self_attn.k_proj.weight"].bfloat16())


def test_the_hand_packing_is_compressed_tensors_packing() -> None:
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    q = ints(ROWS, COLS, 9)
    assert torch.equal(pack(q), pack_to_int32(torch.tensor(q, dtype=torch.int8), 4))
    assert torch.equal(pack(q, along_rows=True), pack_to_int32(torch.tensor(q, dtype=torch.int8), 4, packed_dim=0))
    eight = torch.randint(-128, 128, (ROWS, COLS - 3), generator=torch.Generator().manual_seed(8), dtype=torch.int8)
    for dim in (0, 1):
        words = pack_to_int32(eight, 8, packed_dim=dim)
        assert torch.equal(unpack.unpack_int32(words, 8, eight.shape[dim], dim=dim), eight.to(torch.int16))


def test_a_second_unpack_reads_nothing(packed_model: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    ref = ModelRef.of(packed_model["path"])
    first = ensure_unpacked(ref, dtype="float32")
    before = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}

    def no_reading(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the cached unpacked model was read or written again")

    monkeypatch.setattr(unpack, "unpack_into", no_reading)
    monkeypatch.setattr(unpack, "packed_scheme", no_reading)
    monkeypatch.setattr("safetensors.safe_open", no_reading)
    assert ensure_unpacked(ref, dtype="float32") == first
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == before


def test_only_exactly_unpackable_schemes_are_unpacked() -> None:
    assert packed_scheme(W4A16) == unpack.PackedScheme(4)
    three_bits = json.loads(json.dumps(W4A16))
    three_bits["config_groups"]["group_0"]["weights"]["num_bits"] = 3  # packed differently by 0.17 and 0.19
    fp8 = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {
        "weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8}}}}
    for config in (three_bits, fp8, {"quant_method": "awq", "bits": 4}, {**W4A16, "kv_cache_scheme": {"num_bits": 8}},
                   None):
        assert packed_scheme(config) is None, config


def avx2_cpu() -> Any:
    cpu = detect_cpu()
    flags = frozenset(f for f in cpu.flags if not f.startswith(("avx512", "amx")))
    return dataclasses.replace(cpu, avx512=False, avx512_bf16=False, amx=False, flags=flags)


def test_eval_on_a_cpu_without_the_w4a16_kernel_serves_the_unpacked_weights(
    packed_model: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM is given the unpacked float32 directory (not the transformers backend), and the report says so."""
    from qlift import cpu_support, hardware
    from qlift.eval import evaluate
    from qlift.eval.vllm_backend import VllmBackend

    monkeypatch.setattr(hardware, "detect_cpu", avx2_cpu)
    monkeypatch.setattr(cpu_support, "detect_cpu", avx2_cpu)
    monkeypatch.setattr(cpu_support, "cpu_can_run", lambda *a, **k: cpu_support.Verdict(False, "no cpu_gemm_wna16"))
    jobs: list[dict[str, Any]] = []

    def run(self: VllmBackend, job: Any, model: EvalModel, env: Any) -> dict[str, Any]:
        jobs.append(job.model_dump())
        gens = [{"text": "Paris", "output_tokens": 1, "latency_s": 0.1} for _ in job.requests]
        return {"generations": gens, "load_s": 1.0, "generate_s": 1.0, "vllm_version": "test"}

    monkeypatch.setattr(VllmBackend, "_run", run)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "Capital of France?", "reference": "Paris"}) + "\n")
    result = evaluate(str(packed_model["path"]), prompts=prompts, backend="vllm", metrics="exact_match",
                      report_dir=tmp_path / "report")
    unpacked = ensure_unpacked(ModelRef.of(packed_model["path"]), dtype="float32")
    assert [(j["model"], j["dtype"]) for j in jobs] == [(str(unpacked), "float32")]
    assert result.answers == {"candidate": "vLLM, weights unpacked from W4A16 to float32"}
    assert "Answers: candidate: vLLM, weights unpacked from W4A16 to float32." in (
        tmp_path / "report" / "report.md").read_text()
    assert json.loads((tmp_path / "report" / "report.json").read_text())["answers"] == result.answers
    if cpu_support.vllm_cpu_build() is not None:  # the unpacked answers have their own cache entries
        assert result.cache.numerics["candidate"].endswith(", float32, weights unpacked from W4A16 to float32")


ROUTE = """
import json, sys
from pathlib import Path
from qlift.eval.generation import EvalModel
from qlift.hardware import detect_cpu
from qlift.eval.vllm_backend import VllmBackend
from qlift.models.ref import ModelRef
path = Path(sys.argv[1])
print(json.dumps(VllmBackend().route(EvalModel("candidate", str(path), ref=ModelRef.of(path)))))
"""


def test_the_emulated_avx2_host_evaluates_w4a16_through_vllm_on_unpacked_weights(
    packed_model: dict[str, Any]
) -> None:
    """QLIFT_EMULATE_AVX2=1 (.ci/avx2 on PYTHONPATH): no W4A16 kernel, no bf16 units, so unpacked to float32."""
    from qlift.cpu_support import cpu_can_run, vllm_cpu_build

    if vllm_cpu_build() is None:
        pytest.skip("vllm-cpu is not installed: no CPU kernel library to decide by")
    env = {**os.environ, "PYTHONPATH": str(REPO / ".ci" / "avx2")}
    proc = subprocess.run([sys.executable, "-c", ROUTE, str(packed_model["path"])], capture_output=True, text=True,
                          env=env, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    route = json.loads(proc.stdout.strip().splitlines()[-1])
    assert route == ["float32", "vLLM, weights unpacked from W4A16 to float32"]

    from qlift.eval.vllm_backend import VllmBackend

    here = VllmBackend().route(EvalModel("candidate", str(packed_model["path"]), ref=ModelRef.of(packed_model["path"])))
    if cpu_can_run(W4A16).ok:  # this machine, not emulated: the kernel where vllm-cpu has it
        assert tuple(here) == (None, "vLLM, W4A16 kernel")
