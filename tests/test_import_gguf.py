"""import-gguf: the embedded SmolLM2 becomes a real checkpoint transformers can run."""

from __future__ import annotations

import json

import pytest
from substrate import PARIS_PROMPT

from qlift.lineage import read_manifest


def test_builtin_materialize_reuses_cache(run_cli, smollm2_dir, tmp_path) -> None:
    out = tmp_path / "smol"
    result = run_cli("import-gguf", "--builtin", "smollm2", "-o", out, "--json")
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)
    assert r["cached"] is True and r["architecture"] == "LlamaForCausalLM"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "qlift.json"):
        assert (out / name).is_file(), name
    manifest = read_manifest(out)
    assert manifest and manifest["operation"] == "import-gguf"
    assert manifest["inputs"][0]["content_hash"].startswith("sha256:")
    again = run_cli("import-gguf", "--builtin", "smollm2", "-o", out)
    assert again.exit_code == 3 and "--force" in again.stderr


def test_builtin_cache_hit_reports_the_model(run_cli, smollm2_dir, tmp_path) -> None:
    """Without -o the cached copy's path, described like any import (was parameters=0 on a hit)."""
    hit = run_cli("import-gguf", "--builtin", "smollm2", "--json")
    assert hit.exit_code == 0, hit.stderr
    r = json.loads(hit.stdout)
    assert r["cached"] is True and r["output"] == str(smollm2_dir)
    assert r["architecture"] == "LlamaForCausalLM" and 130_000_000 < r["parameters"] < 140_000_000
    copy = json.loads(run_cli("import-gguf", "--builtin", "smollm2", "-o", tmp_path / "s", "--json").stdout)
    assert copy["parameters"] == r["parameters"]


def test_converted_smollm2_answers_with_transformers(smollm2_dir) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": PARIS_PROMPT}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer


@pytest.mark.parametrize("args", [[], ["x.gguf", "--builtin", "smollm2"], ["missing.gguf", "-o", "o"]])
def test_import_gguf_bad_input(run_cli, tmp_path, monkeypatch, args) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli("import-gguf", *args)
    assert result.exit_code in (2, 4)
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")
    assert not (tmp_path / "o").exists()
