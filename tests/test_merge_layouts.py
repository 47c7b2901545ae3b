"""Every adapter layout peft saves and loads, merged by qlift and by peft's merge_and_unload.

A fine-tune that resized the vocabulary and trained whole embedding layers (modules_to_save)
saves, per module ``X``: ``X.weight`` (the trained copy, what peft loads), ``X.modules_to_save.weight``
(the same copy again, which peft's loader ignores) and ``X.original_module.weight`` (the resized
base layer, which merge_and_unload discards). Each layout here is built by peft itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import _cached
from safetensors import safe_open
from substrate import read_config, tensors_of
from test_merge import assert_close, merge, peft_merged

ROWS = 152_000  # the tiny bases have 151,936 embedding rows


def _build(base: Path, out: Path, *, resize: int | None, seed: int, save_embedding_layers: Any = "auto",
           **lora: Any) -> Path:
    """A peft adapter on ``base`` (resized first when asked) whose trained parts differ from the base."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if resize:
        model.resize_token_embeddings(resize, mean_resizing=False)
        with torch.no_grad():
            model.get_input_embeddings().weight[-(resize - 151_936):].normal_(0, 0.05)
    lora.setdefault("target_modules", ["q_proj"])
    pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, **lora))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if p.requires_grad and any(k in n for k in ("modules_to_save", "trainable_tokens")):
                p.add_(torch.randn_like(p) * 0.02)
    pm.save_pretrained(out, save_embedding_layers=save_embedding_layers)
    return out


MTS_BOTH = ["embed_tokens", "lm_head"]
# name -> (tied base?, resize to, LoraConfig/save arguments)
LAYOUTS: dict[str, tuple[bool, int | None, dict[str, Any]]] = {
    "resized-mts-both": (False, ROWS, dict(modules_to_save=MTS_BOTH)),
    "resized-mts-both-tied": (True, ROWS, dict(modules_to_save=MTS_BOTH)),
    "resized-mts-both-tied-ensure-tying": (True, ROWS, dict(modules_to_save=MTS_BOTH, ensure_weight_tying=True)),
    "resized-mts-head": (False, ROWS, dict(modules_to_save=["lm_head"])),
    "resized-mts-head-tied": (True, ROWS, dict(modules_to_save=["lm_head"])),
    "resized-mts-embed": (False, ROWS, dict(modules_to_save=["embed_tokens"])),
    "resized-mts-embed-tied": (True, ROWS, dict(modules_to_save=["embed_tokens"])),
    "resized-lora-embed-tied": (True, ROWS, dict(target_modules=["embed_tokens", "q_proj"])),
    "resized-tokens-mts-head": (False, ROWS, dict(trainable_token_indices=[5, ROWS - 1], modules_to_save=["lm_head"])),
    "mts-both-saved-embeddings": (False, None, dict(modules_to_save=MTS_BOTH, save_embedding_layers=True)),
    "mts-head-saved-embeddings-tied": (True, None, dict(modules_to_save=["lm_head"], save_embedding_layers=True)),
}


@pytest.fixture(scope="module")
def layouts(tiny_qwen2_tied: Path, tiny_qwen2_untied: Path) -> dict[str, Path]:
    out = {}
    for i, (name, (tied, resize, kw)) in enumerate(LAYOUTS.items()):
        base = tiny_qwen2_tied if tied else tiny_qwen2_untied
        out[name] = _cached(f"merge-layout-{name}-v1",
                            lambda p, b=base, r=resize, k=kw, s=20 + i: _build(b, p, resize=r, seed=s, **k))
    return out


def _keys(adapter: Path) -> set[str]:
    with safe_open(adapter / "adapter_model.safetensors", "pt") as f:
        return set(f.keys())


def test_the_issue_layout_is_what_peft_saves(layouts) -> None:
    keys = _keys(layouts["resized-mts-both"])
    for module in ("lm_head", "model.embed_tokens"):
        for infix in ("", ".modules_to_save", ".original_module"):
            assert f"base_model.model.{module}{infix}.weight" in keys


def test_resized_untied_vocab_without_its_head_is_refused(run_cli, tmp_path, tiny_qwen2_untied) -> None:
    """LoRA on the embeddings of a resized untied model saves the embeddings but not lm_head: peft
    loads it only onto a base the user resized by hand (new head rows random), so there is no
    merge to reproduce. qlift says what is missing instead of inventing rows."""
    ad = _cached("merge-layout-resized-lora-embed-v1", lambda p: _build(
        tiny_qwen2_untied, p, resize=ROWS, seed=40, target_modules=["embed_tokens", "q_proj"]))
    assert "base_model.model.model.embed_tokens.base_layer.weight" in _keys(ad)
    r = run_cli("merge", tiny_qwen2_untied, ad, "-o", tmp_path / "out", "--no-verify")
    assert r.exit_code == 6 and "lm_head.weight has 151936" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_peft(name, layouts, run_cli, tmp_path, tiny_qwen2_tied, tiny_qwen2_untied) -> None:
    tied, resize, _ = LAYOUTS[name]
    base = tiny_qwen2_tied if tied else tiny_qwen2_untied
    out = tmp_path / "merged"
    res = merge(run_cli, base, layouts[name], out=out)
    ref = peft_merged(base, [layouts[name]], resize=resize)
    got = tensors_of(out)
    for n, t in got.items():
        if n == "lm_head.weight" and n not in ref:
            continue
        assert_close(t, ref[n], n)
    cfg = read_config(out)
    rows = resize or 151_936
    assert cfg["vocab_size"] == rows == got["model.embed_tokens.weight"].shape[0]
    # what peft's merged model computes with: its input embeddings and its output head
    assert_close(got["model.embed_tokens.weight"], ref["model.embed_tokens.weight"], "embed_tokens")
    head = got.get("lm_head.weight", got["model.embed_tokens.weight"])
    assert_close(head, ref["lm_head.weight"], "lm_head")
    assert cfg["tie_word_embeddings"] is ("lm_head.weight" not in got)
    assert not any(".modules_to_save." in n or ".original_module." in n for n in got)
    assert res["vocab_size"] == rows if "vocab_size" in res else True


def test_a_trained_copy_without_the_key_peft_loads_is_bad_input(layouts, run_cli, tmp_path,
                                                                  tiny_qwen2_untied) -> None:
    """peft loads ``X.weight``; a file with only ``X.modules_to_save.weight`` fails in peft, and here
    it is one line naming the file, not a silent merge without the trained head."""
    import shutil

    from safetensors.torch import load_file, save_file

    ad = tmp_path / "adapter"
    shutil.copytree(layouts["resized-mts-both"], ad)
    tensors = load_file(ad / "adapter_model.safetensors")
    del tensors["base_model.model.lm_head.weight"]
    save_file(tensors, ad / "adapter_model.safetensors", metadata={"format": "pt"})
    r = run_cli("merge", tiny_qwen2_untied, ad, "-o", tmp_path / "out", "--no-verify")
    assert r.exit_code == 2, r.stderr
    assert "lm_head.modules_to_save.weight" in r.stderr and "adapter_model.safetensors" in r.stderr
    assert not (tmp_path / "out").exists()
