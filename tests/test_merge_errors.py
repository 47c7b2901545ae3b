"""qlift merge refuses bad input with one clear line and writes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import _cached


def _build_other(base: Path, out: Path, kind: str) -> Path:
    """A real non-LoRA peft adapter (IA3, LoHa, VeRA) saved as a fine-tune saves it."""
    import peft
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg: Any = {
        "IA3": lambda: peft.IA3Config(target_modules=["k_proj", "down_proj"], feedforward_modules=["down_proj"]),
        "LOHA": lambda: peft.LoHaConfig(r=4, target_modules=["q_proj"]),
        "VERA": lambda: peft.VeraConfig(r=4, target_modules=["q_proj", "o_proj"]),
    }[kind]()
    peft.get_peft_model(model, cfg).save_pretrained(out)
    return out


def _copy_adapter(src: Path, dst: Path, **config_changes: Any) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".complete"))
    cfg = json.loads((dst / "adapter_config.json").read_text())
    cfg.update(config_changes)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return dst


def assert_refused(r: Any, code: int, *needles: str, out: Path) -> None:
    assert r.exit_code == code, (r.exit_code, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.*")), "a partial output was left behind"


@pytest.mark.parametrize("kind", ["IA3", "LOHA", "VERA"])
def test_non_lora_adapter_is_refused_by_type(kind, run_cli, tmp_path, tiny_qwen2_untied) -> None:
    ad = _cached(f"merge-adapter-{kind.lower()}-v1", lambda p: _build_other(tiny_qwen2_untied, p, kind))
    out = tmp_path / "out"
    r = run_cli("merge", tiny_qwen2_untied, ad, "-o", out, "--no-verify")
    assert_refused(r, 6, f"is a {kind} adapter", "only LoRA", out=out)


@pytest.mark.parametrize("peft_type", ["ADALORA", "LOKR"])
def test_other_types_by_config(peft_type, run_cli, tmp_path, tiny_qwen2_tied, tiny_lora_tied) -> None:
    ad = _copy_adapter(tiny_lora_tied, tmp_path / "ad", peft_type=peft_type)
    out = tmp_path / "out"
    assert_refused(run_cli("merge", tiny_qwen2_tied, ad, "-o", out), 6, peft_type, out=out)


def test_unmergeable_lora_variant(run_cli, tmp_path, tiny_qwen2_tied, tiny_lora_tied) -> None:
    ad = _copy_adapter(tiny_lora_tied, tmp_path / "ad", alora_invocation_tokens=[1, 2])
    out = tmp_path / "out"
    assert_refused(run_cli("merge", tiny_qwen2_tied, ad, "-o", out), 6, "aLoRA", out=out)


def test_pickle_adapter_needs_allow_pickle(run_cli, tmp_path, tiny_qwen2_tied, tiny_lora_tied) -> None:
    from safetensors.torch import load_file

    ad = _copy_adapter(tiny_lora_tied, tmp_path / "ad")
    torch.save(load_file(ad / "adapter_model.safetensors"), ad / "adapter_model.bin")
    (ad / "adapter_model.safetensors").unlink()
    out = tmp_path / "out"
    r = run_cli("merge", tiny_qwen2_tied, ad, "-o", out, "--no-verify")
    assert_refused(r, 5, "pickle", "--allow-pickle", out=out)
    r = run_cli("merge", tiny_qwen2_tied, ad, "-o", out, "--no-verify", "--allow-pickle")
    assert r.exit_code == 0, r.stderr
    assert (out / "qlift.json").is_file()


def test_shape_mismatch(run_cli, tmp_path, smollm2_dir, tiny_lora_tied) -> None:
    out = tmp_path / "out"
    r = run_cli("merge", smollm2_dir, tiny_lora_tied, "-o", out, "--no-verify")
    assert_refused(r, 6, "update, the base weight is (576, ", "tiny-qwen2-tied-v1' as its base", out=out)


def test_missing_target_module(run_cli, tmp_path, tiny_qwen2_tied, tiny_lora_tied) -> None:
    from safetensors.torch import load_file, save_file

    ad = _copy_adapter(tiny_lora_tied, tmp_path / "ad")
    t = load_file(ad / "adapter_model.safetensors")
    t = {k.replace("layers.1.", "layers.7."): v for k, v in t.items()}
    save_file(t, ad / "adapter_model.safetensors")
    out = tmp_path / "out"
    r = run_cli("merge", tiny_qwen2_tied, ad, "-o", out)
    assert_refused(r, 6, "no tensor model.layers.7.", out=out)


def test_rank_inconsistent_with_config(run_cli, tmp_path, tiny_qwen2_tied, tiny_lora_tied) -> None:
    ad = _copy_adapter(tiny_lora_tied, tmp_path / "ad", r=4)
    out = tmp_path / "out"
    assert_refused(run_cli("merge", tiny_qwen2_tied, ad, "-o", out), 2, "inconsistent rank", out=out)


def test_existing_output_needs_force(run_cli, tmp_path, tiny_qwen2_tied, tiny_lora_tied) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = run_cli("merge", tiny_qwen2_tied, tiny_lora_tied, "-o", out, "--no-verify")
    assert r.exit_code == 3 and r.stderr.strip().splitlines() == [
        f"error: output {out} already exists. Pass --force to replace it, or choose another -o path."]
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    r = run_cli("merge", tiny_qwen2_tied, tiny_lora_tied, "-o", out, "--no-verify", "--force")
    assert r.exit_code == 0 and not (out / "keep.txt").exists()


def test_base_name_mismatch_warns_or_fails_with_strict(run_cli, tmp_path, tiny_qwen2_tied, tiny_lora_tied) -> None:
    ad = _copy_adapter(tiny_lora_tied, tmp_path / "ad", base_model_name_or_path="Qwen/Qwen2.5-7B-Instruct")
    out = tmp_path / "out"
    assert_refused(run_cli("merge", tiny_qwen2_tied, ad, "-o", out, "--strict"), 6, "Qwen2.5-7B", out=out)
    r = run_cli("merge", tiny_qwen2_tied, ad, "-o", out, "--no-verify")
    assert r.exit_code == 0 and "warning: " in r.stderr and "Qwen2.5-7B" in r.stderr


def test_missing_adapter_and_bad_shard_size(run_cli, tmp_path, tiny_qwen2_tied, tiny_lora_tied) -> None:
    out = tmp_path / "out"
    assert_refused(run_cli("merge", tiny_qwen2_tied, tmp_path / "nope", "-o", out), 4, "does not exist", out=out)
    r = run_cli("merge", tiny_qwen2_tied, tiny_lora_tied, "-o", out, "--max-shard-size", "lots")
    assert_refused(r, 2, "--max-shard-size", out=out)
