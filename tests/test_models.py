"""ModelDir, inspect, the lineage manifest and atomic outputs, on real checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest

from qlift.errors import BadInputError, OutputExistsError, UnsafeInputError
from qlift.fsutil import atomic_output_dir
from qlift.lineage import MANIFEST_NAME, lineage_chain, read_manifest, write_manifest
from qlift.models import ModelDir


def test_inspect_smollm2_json(run_cli, smollm2_dir) -> None:
    result = run_cli("inspect", smollm2_dir, "--json")
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)
    assert r["architecture"] == "LlamaForCausalLM"
    assert r["parameters"] == 134_515_008
    assert r["weight_dtypes"] == {"BF16": 134_515_008}
    assert (r["hidden_size"], r["num_layers"], r["num_attention_heads"], r["num_key_value_heads"]) == (576, 30, 9, 3)
    assert r["tied_embeddings"] is True
    assert r["vocab_size"] == r["tokenizer_length"] == 49152
    assert r["has_chat_template"] is True
    assert r["lineage"] == ["import-gguf"]
    assert r["size_on_disk"] > 260_000_000


def test_inspect_human_shows_vocab_padding(run_cli, tiny_qwen2_untied) -> None:
    result = run_cli("inspect", tiny_qwen2_untied)
    assert result.exit_code == 0
    assert "151936 rows / 151665 tokens" in result.stdout
    assert "tied embeddings    no" in result.stdout


def test_modeldir_reads_headers_only(tiny_qwen2_tied) -> None:
    md = ModelDir.open(tiny_qwen2_tied)
    q = md.tensors["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (64, 64) and q.dtype == "BF16" and q.nbytes == 64 * 64 * 2
    assert md.weight_bytes == sum(t.nbytes for t in md.tensors.values())
    assert md.parameter_count == sum(t.numel for t in md.tensors.values())
    assert md.generation_config and md.generation_config["eos_token_id"] == [151645, 151643]


@pytest.mark.parametrize("broken", ["no_config", "bad_json", "truncated_weights", "pickle_only"])
def test_broken_model_dirs_give_clear_errors(tmp_path, tiny_qwen2_tied, run_cli, broken) -> None:
    d = tmp_path / "m"
    shutil.copytree(tiny_qwen2_tied, d)
    weights = d / "model.safetensors"
    expected_code = 2
    if broken == "no_config":
        (d / "config.json").unlink()
    elif broken == "bad_json":
        (d / "config.json").write_text("{not json")
    elif broken == "truncated_weights":
        weights.write_bytes(b"\x01\x02")
    else:
        weights.rename(d / "pytorch_model.bin")
        with pytest.raises(UnsafeInputError):
            ModelDir.open(d).require_weights()
        return
    result = run_cli("inspect", d)
    assert result.exit_code == expected_code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr


def test_lineage_survives_stages_and_reuses_hashes(tmp_path, tiny_qwen2_tied) -> None:
    stage1 = tmp_path / "stage1"
    with atomic_output_dir(stage1) as tmp:
        shutil.copy(tiny_qwen2_tied / "config.json", tmp / "config.json")
        (tmp / "w.bin").write_bytes(b"x" * 1000)
        write_manifest(tmp, operation="download", inputs={}, parameters={"repo": "org/m"}, started_at="t0")
    stage2 = tmp_path / "stage2"
    with atomic_output_dir(stage2) as tmp:
        (tmp / "config.json").write_text("{}")
        m2 = write_manifest(tmp, operation="merge", inputs={"base": stage1}, parameters={}, started_at="t1")
    data = read_manifest(stage2)
    assert data is not None
    assert lineage_chain(data) == ["download", "merge"]
    assert data["parents"]["base"]["parameters"] == {"repo": "org/m"}
    assert data["inputs"][0]["content_hash"].startswith("sha256:")
    assert "config.json" in data["outputs"] and MANIFEST_NAME not in data["outputs"]
    # A changed input file changes the input's content hash.
    (stage1 / "w.bin").write_bytes(b"y" * 1000)
    from qlift.lineage import describe_input

    ref, _ = describe_input("base", stage1)
    assert ref.content_hash != m2.inputs[0].content_hash


def test_atomic_output_dir_keeps_old_output_on_failure(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with pytest.raises(OutputExistsError), atomic_output_dir(out):
        pass
    with pytest.raises(RuntimeError), atomic_output_dir(out, force=True) as tmp:
        (tmp / "new.txt").write_text("new")
        raise RuntimeError("fail half way")
    assert (out / "keep.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temp dir left behind
    with atomic_output_dir(out, force=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    with pytest.raises(BadInputError), atomic_output_dir(tmp_path / "no" / "such" / "parent"):
        pass
