"""qlift merge against peft's merge_and_unload on tiny Qwen2 models (tied and untied)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import _cached
from substrate import read_config, tensors_of

from qlift.fsutil import sha256_file
from qlift.models.ref import dir_hash

BF16_EPS = 2.0**-7  # one bf16 ulp, relative


def peft_merged(base: Path, adapters: list[Path], *, dtype: torch.dtype = torch.bfloat16,
                resize: int | None = None) -> dict[str, torch.Tensor]:
    """The reference: each adapter loaded with peft and merged with merge_and_unload, in order."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    if resize:
        model.resize_token_embeddings(resize)
    for a in adapters:
        model = PeftModel.from_pretrained(model, a).merge_and_unload()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_close(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """Equal, or within one bf16 ulp (matmul blocking may round the last bit differently)."""
    assert got.shape == want.shape, name
    assert got.dtype == want.dtype, name
    if torch.equal(got, want):
        return
    g, w = got.float(), want.float()
    ulp = w.abs().clamp_min(1e-30) * BF16_EPS
    assert bool(((g - w).abs() <= ulp).all()), f"{name}: max diff {(g - w).abs().max()}"


def assert_matches_peft(out: Path, ref: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    got = tensors_of(out)
    assert set(got) <= set(ref), set(got) - set(ref)
    for name, t in got.items():
        assert_close(t, ref[name], name)
    return got


def merge(run_cli, base: Path, *adapters: Path, out: Path, extra: tuple[str, ...] = ()) -> Any:  # type: ignore[no-untyped-def]
    r = run_cli("merge", base, *adapters, "-o", out, "--no-verify", "--json", *extra)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


# --- adapters (real peft adapters, built once and cached) ---------------------------------

def build_trained(base: Path, out: Path, *, seed: int = 1, target_modules: Any = "all-linear", r: int = 8,
                  lora_alpha: int = 16, **kw: Any) -> Path:
    """substrate.build_lora, plus training-like noise on DoRA magnitudes, modules_to_save copies
    and trainable-token rows (peft initialises those to the base's values, a no-op merge)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=target_modules, init_lora_weights=False,
                     task_type="CAUSAL_LM", **kw)
    pm = get_peft_model(model, cfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if p.requires_grad and any(k in n for k in ("magnitude", "modules_to_save", "trainable_tokens")):
                p.add_(torch.randn_like(p) * 0.02)
    pm.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapters(tiny_qwen2_tied: Path, tiny_qwen2_untied: Path) -> dict[str, Path]:
    t, u = tiny_qwen2_tied, tiny_qwen2_untied
    specs: dict[str, tuple[Path, dict[str, Any]]] = {
        "dora": (u, dict(target_modules=["q_proj", "v_proj", "down_proj"], use_dora=True)),
        "bias": (u, dict(target_modules=["q_proj", "k_proj", "v_proj"], lora_bias=True, seed=2)),
        "rslora": (u, dict(target_modules="all-linear", use_rslora=True, r=8, lora_alpha=8, seed=3,
                          rank_pattern={"q_proj": 4, "layers.1.mlp.up_proj": 2},
                          alpha_pattern={"v_proj": 32})),
        "emb": (u, dict(target_modules=["embed_tokens", "q_proj"], seed=4)),
        "emb_dora": (u, dict(target_modules=["embed_tokens"], use_dora=True, seed=5)),
        "mts": (u, dict(target_modules=["q_proj"], modules_to_save=["lm_head"], seed=6)),
        "tokens_tied": (t, dict(target_modules=["q_proj"], trainable_token_indices=[3, 151644, 151700], seed=7)),
        "head_tied": (t, dict(target_modules=["lm_head", "v_proj"], seed=8)),
        "mts_tied": (t, dict(target_modules=["q_proj"], modules_to_save=["lm_head"], seed=9)),
        "emb_tied": (t, dict(target_modules=["embed_tokens"], seed=10)),
        "plain_u": (u, dict(seed=11)),
    }
    out = {}
    for name, (base, kw) in specs.items():
        out[name] = _cached(f"merge-adapter-{name}-v1", lambda p, b=base, k=kw: build_trained(b, p, **k))
    return out


# --- features against peft ----------------------------------------------------------------

def test_plain_lora_tied_matches_peft_and_carries_serving_files(run_cli, tmp_path, tiny_qwen2_tied,
                                                                 tiny_lora_tied) -> None:
    out = tmp_path / "merged"
    res = merge(run_cli, tiny_qwen2_tied, tiny_lora_tied, out=out)
    got = assert_matches_peft(out, peft_merged(tiny_qwen2_tied, [tiny_lora_tied]))
    assert "lm_head.weight" not in got  # still tied
    cfg = read_config(out)
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == 151_936  # padded rows never trimmed
    assert cfg["dtype"] == "bfloat16" and "_name_or_path" not in cfg
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (out / f).read_bytes() == (tiny_qwen2_tied / f).read_bytes(), f
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in got.values())
    assert set(index["weight_map"]) == set(got)
    manifest = json.loads((out / "qlift.json").read_text())
    assert manifest["operation"] == "merge"
    for rel, rec in manifest["outputs"].items():  # digests taken while streaming are the real ones
        assert rec["sha256"] == sha256_file(out / rel), rel
    assert res["modified_tensors"] == 14 and res["tie_word_embeddings"] is True
    # The result carries the output's ModelRef, hashed as it was written: what hashing the dir again gives.
    assert res["model_ref"] == {"base": str(out), "adapters": [], "content_hash": dir_hash(out)}


@pytest.mark.parametrize("name", ["dora", "bias", "rslora", "emb", "emb_dora", "mts", "plain_u"])
def test_feature_matches_peft_untied(name, adapters, run_cli, tmp_path, tiny_qwen2_untied) -> None:
    out = tmp_path / name
    merge(run_cli, tiny_qwen2_untied, adapters[name], out=out)
    got = assert_matches_peft(out, peft_merged(tiny_qwen2_untied, [adapters[name]]))
    base = tensors_of(tiny_qwen2_untied)
    changed = {n for n in got if not torch.equal(got[n], base[n])}
    assert changed, "the adapter changed nothing"
    if name == "bias":
        assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.v_proj.bias"} <= changed
    if name in ("emb", "emb_dora"):
        assert "model.embed_tokens.weight" in changed
    if name == "mts":
        assert changed >= {"lm_head.weight"}
    assert read_config(out)["tie_word_embeddings"] is False


def test_fp32_output_matches_peft_in_fp32(adapters, run_cli, tmp_path, tiny_qwen2_untied) -> None:
    out = tmp_path / "fp32"
    merge(run_cli, tiny_qwen2_untied, adapters["dora"], out=out, extra=("--dtype", "fp32"))
    assert_matches_peft(out, peft_merged(tiny_qwen2_untied, [adapters["dora"]], dtype=torch.float32))
    assert read_config(out)["dtype"] == "float32"


def test_several_adapters_apply_in_order(adapters, run_cli, tmp_path, tiny_qwen2_untied) -> None:
    order = [adapters["plain_u"], adapters["dora"], adapters["bias"]]
    out = tmp_path / "stack"
    res = merge(run_cli, tiny_qwen2_untied, *order, out=out)
    assert_matches_peft(out, peft_merged(tiny_qwen2_untied, order))
    assert len(res["adapters"]) == 3
    manifest = json.loads((out / "qlift.json").read_text())
    assert [i["role"] for i in manifest["inputs"]] == ["base", "adapter1", "adapter2", "adapter3"]


# --- tied embeddings ----------------------------------------------------------------------

def test_trainable_tokens_on_tied_base_stay_tied(adapters, run_cli, tmp_path, tiny_qwen2_tied) -> None:
    out = tmp_path / "tok"
    merge(run_cli, tiny_qwen2_tied, adapters["tokens_tied"], out=out)
    got = assert_matches_peft(out, peft_merged(tiny_qwen2_tied, [adapters["tokens_tied"]]))
    assert "lm_head.weight" not in got and read_config(out)["tie_word_embeddings"] is True
    base = tensors_of(tiny_qwen2_tied)["model.embed_tokens.weight"]
    rows = (got["model.embed_tokens.weight"] != base).any(dim=1).nonzero().flatten().tolist()
    assert rows == [3, 151644, 151700]


def test_embedding_lora_on_tied_base_stays_tied(adapters, run_cli, tmp_path, tiny_qwen2_tied) -> None:
    out = tmp_path / "emb"
    merge(run_cli, tiny_qwen2_tied, adapters["emb_tied"], out=out)
    got = assert_matches_peft(out, peft_merged(tiny_qwen2_tied, [adapters["emb_tied"]]))
    assert "lm_head.weight" not in got and read_config(out)["tie_word_embeddings"] is True


@pytest.mark.parametrize("name", ["head_tied", "mts_tied"])
def test_lm_head_change_on_tied_base_unties(name, adapters, run_cli, tmp_path, tiny_qwen2_tied) -> None:
    out = tmp_path / name
    merge(run_cli, tiny_qwen2_tied, adapters[name], out=out)
    got = tensors_of(out)
    base = tensors_of(tiny_qwen2_tied)
    assert read_config(out)["tie_word_embeddings"] is False
    # The input embeddings are the base's; the head is what peft's forward uses.
    assert torch.equal(got["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    ref = peft_merged(tiny_qwen2_tied, [adapters[name]])  # peft's merge writes the head into the shared weight
    assert_close(got["lm_head.weight"], ref["lm_head.weight"], "lm_head.weight")
    assert not torch.equal(got["lm_head.weight"], base["model.embed_tokens.weight"])
    for n in got:
        if n not in ("lm_head.weight", "model.embed_tokens.weight"):
            assert_close(got[n], ref[n], n)
    # and transformers reads it back untied
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(out)
    assert not torch.equal(m.lm_head.weight, m.model.embed_tokens.weight)


# --- resized vocabulary -------------------------------------------------------------------

def _build_resized(base: Path, out: Path, *, rows: int) -> Path:
    """A fine-tune that added tokens: resized embeddings saved with the adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(12)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.resize_token_embeddings(rows)
    with torch.no_grad():
        model.get_input_embeddings().weight[-8:].normal_(0, 0.05)
    cfg = LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False, trainable_token_indices=[rows - 1])
    pm = get_peft_model(model, cfg)
    pm.save_pretrained(out, save_embedding_layers=True)
    return out


@pytest.mark.parametrize("tied", [True, False])
def test_resized_vocab_updates_config(tied, run_cli, tmp_path, tiny_qwen2_tied, tiny_qwen2_untied) -> None:
    base = tiny_qwen2_tied if tied else tiny_qwen2_untied
    rows = 152_000
    ad = _cached(f"merge-adapter-resized-{tied}-v1", lambda p: _build_resized(base, p, rows=rows))
    out = tmp_path / "resized"
    merge(run_cli, base, ad, out=out)
    got = assert_matches_peft(out, peft_merged(base, [ad], resize=rows))
    cfg = read_config(out)
    assert cfg["vocab_size"] == rows and cfg["tie_word_embeddings"] is tied
    assert got["model.embed_tokens.weight"].shape[0] == rows
    assert ("lm_head.weight" in got) is not tied


def _build_tiny_llama(out: Path, *, vocab: int) -> Path:
    """A random-weight Llama (untied head) without a tokenizer: --verify compares logits on token ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(13)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    model.save_pretrained(out)
    return out


def _build_resized_mts(base: Path, out: Path, *, rows: int) -> Path:
    """What a fine-tune that added tokens saves: resize_token_embeddings before training, and the
    embeddings and head trained whole (modules_to_save), so peft saves them resized."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(14)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.resize_token_embeddings(rows)
    cfg = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["embed_tokens", "lm_head"],
                     init_lora_weights=False, task_type="CAUSAL_LM")
    pm = get_peft_model(model, cfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "modules_to_save" in n:
                p.add_(torch.randn_like(p) * 0.02)
    pm.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def resized_llama() -> tuple[Path, Path]:
    base = _cached("tiny-llama-320-v1", lambda p: _build_tiny_llama(p, vocab=320))
    return base, _cached("merge-adapter-llama-resized-336-v1", lambda p: _build_resized_mts(base, p, rows=336))


def test_default_verify_of_a_resized_vocabulary_resizes_the_reference(run_cli, tmp_path, resized_llama) -> None:
    """Before, peft's reference loaded the adapter onto the base unresized: size mismatch [336, 64] vs [320, 64],
    exit 70. The reference is now resized to the adapter's saved embeddings first, as peft users do."""
    base, ad = resized_llama
    out = tmp_path / "merged"
    r = run_cli("merge", base, ad, "-o", out, "--json")  # --verify is on by default for a model this small
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    v = res["verify"]
    assert v["passed"] and v["inputs"] == "token ids" and v["greedy_agreement"] == 1.0, v
    assert res["vocab_size"] == 336 and read_config(out)["vocab_size"] == 336
    got = assert_matches_peft(out, peft_merged(base, [ad], dtype=torch.float32, resize=336))
    assert got["model.embed_tokens.weight"].shape == got["lm_head.weight"].shape == (336, 64)


def test_a_verify_that_cannot_run_says_so_and_fails_only_when_asked(monkeypatch, run_cli, tmp_path,
                                                                      resized_llama) -> None:
    import qlift.merge.verify as verify

    def broken(**_: Any) -> Any:
        raise RuntimeError("Error(s) in loading state_dict for PeftModelForCausalLM:\n\tsize mismatch ...")

    monkeypatch.setattr(verify, "verify_merge", broken)
    base, ad = resized_llama
    r = run_cli("merge", base, ad, "-o", tmp_path / "auto", "--json")  # verify by default: the merge stands
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["verify"] is None and res["verify_not_run"].startswith("transformers or peft failed (RuntimeError: ")
    said = [ln for ln in r.stderr.splitlines() if "verify was not run" in ln]  # the progress line names verify too
    assert len(said) == 1 and "RuntimeError: Error(s) in loading state_dict" in said[0], r.stderr
    assert "size mismatch" not in r.stderr  # the error's first line only
    assert json.loads((tmp_path / "auto" / "qlift.json").read_text())["parameters"]["verify"] is False

    r = run_cli("merge", base, ad, "-o", tmp_path / "asked", "--verify")  # asked for: no unverified output
    lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("merge: ")]  # less its progress
    assert r.exit_code == 8 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: --verify could not run: transformers or peft failed (RuntimeError: ") and \
        "nothing was written. Rerun with --no-verify" in lines[0], lines[0]
    assert not (tmp_path / "asked").exists()


# --- sharding and --verify ----------------------------------------------------------------

def test_max_shard_size_and_verify(run_cli, tmp_path, tiny_qwen2_untied, adapters) -> None:
    out = tmp_path / "sharded"
    r = run_cli("merge", tiny_qwen2_untied, adapters["dora"], "-o", out, "--max-shard-size", "8MB",
                "--verify", "--json")
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) == len(res["shards"]) >= 3
    index = json.loads((out / "model.safetensors.index.json").read_text())
    from qlift.merge.stio import read_layout

    for s in shards:
        layout = read_layout(s)
        assert sum(t.nbytes for t in layout) <= 8_000_000 or len(layout) == 1
        assert all(index["weight_map"][t.name] == s.name for t in layout)
    v = res["verify"]
    assert v["passed"] and v["relative_delta"] < 0.02 and v["greedy_agreement"] > 0.9
    # Each long step says so on stderr (no terminal here: progress as log lines, from 2 s of writing on).
    steps = [line for line in r.stderr.splitlines() if line.startswith("merge:")]
    assert steps[0].startswith(f"merge: {res['tensors']} tensors, ") and "writing the shards" in steps[0]
    assert any(line.startswith("merge: verifying against peft") for line in steps), steps
    assert steps.index(next(s for s in steps if "verifying" in s)) < steps.index(
        next(s for s in steps if s.startswith("merge: verified")))


def test_row_blocks_give_peft_values(monkeypatch, run_cli, tmp_path, tiny_qwen2_untied, adapters) -> None:
    """Big Linear weights are merged a block of rows at a time; force many blocks on the tiny model."""
    import qlift.merge.maths as maths

    monkeypatch.setattr(maths, "CHUNK_BYTES", 4 * 64 * 5)  # 5 rows per block
    out = tmp_path / "blocks"
    merge(run_cli, tiny_qwen2_untied, adapters["plain_u"], out=out)
    assert_matches_peft(out, peft_merged(tiny_qwen2_untied, [adapters["plain_u"]]))


def test_parallel_pipelines_give_peft_values(monkeypatch, run_cli, tmp_path, tiny_qwen2_untied, adapters) -> None:
    """On a many-core host each output shard gets a pipeline of its own; force that here."""
    run = importlib.import_module("qlift.merge.run")  # the module; qlift.merge.run is the entry point
    from qlift.merge.writer import pipelines

    assert pipelines(4, 2) == 2 and pipelines(4, 16) == 4 and pipelines(8, 16) == 5 and pipelines(1, 64) == 1
    monkeypatch.setattr(run, "_cores", lambda: 12)
    out = tmp_path / "parallel"
    res = merge(run_cli, tiny_qwen2_untied, adapters["dora"], out=out, extra=("--max-shard-size", "8MB"))
    assert len(res["shards"]) >= 3
    assert_matches_peft(out, peft_merged(tiny_qwen2_untied, [adapters["dora"]]))
    manifest = json.loads((out / "qlift.json").read_text())
    for rel, rec in manifest["outputs"].items():
        assert rec["sha256"] == sha256_file(out / rel), rel


def test_a_failing_pipeline_stops_the_others_and_writes_nothing(monkeypatch, run_cli, tmp_path, tiny_qwen2_untied,
                                                                 adapters) -> None:
    import shutil

    run = importlib.import_module("qlift.merge.run")  # the module; qlift.merge.run is the entry point

    monkeypatch.setattr(run, "_cores", lambda: 12)
    base = tmp_path / "base"
    shutil.copytree(tiny_qwen2_untied, base)
    (base / "qlift.json").unlink(missing_ok=True)
    weights = sorted(base.glob("*.safetensors"))[-1]
    with open(weights, "r+b") as fh:  # the last tensors' bytes are gone; the header still names them
        fh.truncate(weights.stat().st_size - 1_000_000)
    # read_header refuses a truncated file up front; skip that check to reach the streaming pipelines
    monkeypatch.setattr("qlift.models.safetensors_header._check_tiling", lambda *a: None)
    out = tmp_path / "out"
    r = run_cli("merge", base, adapters["plain_u"], "-o", out, "--no-verify", "--max-shard-size", "8MB")
    assert r.exit_code == 2, r.stderr  # BadInputError, not the _Stopped of the pipelines it halted
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "file ends early" in errors[0] and "Traceback" not in r.stderr, r.stderr
    assert not out.exists() and not list(tmp_path.glob(".out*")), list(tmp_path.iterdir())


def test_output_keeps_the_base_sharding(run_cli, tmp_path, tiny_qwen2_untied, adapters) -> None:
    """One output shard per base shard (same tensors in each), whatever the machine's cores."""
    import shutil

    from safetensors.torch import save_file

    base = tmp_path / "two-shards"
    shutil.copytree(tiny_qwen2_untied, base, ignore=shutil.ignore_patterns("*.safetensors*", "qlift.json"))
    names = sorted(tensors_of(tiny_qwen2_untied))
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    everything = tensors_of(tiny_qwen2_untied)
    for fname, part in halves.items():
        save_file({n: everything[n] for n in part}, base / fname, metadata={"format": "pt"})
    weight_map = {n: f for f, part in halves.items() for n in part}
    (base / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    out = tmp_path / "merged"
    res = merge(run_cli, base, adapters["plain_u"], out=out)
    assert res["shards"] == sorted(halves)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == weight_map
    assert_matches_peft(out, peft_merged(tiny_qwen2_untied, [adapters["plain_u"]]))


def test_sigterm_mid_merge_leaves_nothing_behind(tmp_path, tiny_qwen2_untied, adapters) -> None:
    """SIGTERM unwinds like Ctrl-C: exit 143 and the partial output is removed."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "merged"
    proc = subprocess.Popen([sys.executable, "-m", "qlift", "merge", str(tiny_qwen2_untied), str(adapters["plain_u"]),
                             "-o", str(out), "--verify"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        # config.json comes after the shards, then --verify loads two models: seconds to hit.
        while not list(tmp_path.glob(".merged.*.partial/config.json")) and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "terminated"
    assert not out.exists() and not list(tmp_path.glob(".merged.*")), list(tmp_path.iterdir())
