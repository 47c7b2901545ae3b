"""`qlift plan` at tensor_parallel_size 2 against vLLM 0.26.0's own KV cache formulas, on paper (no GPU).

For Qwen2.5-14B- and 32B-shaped models (header-only safetensors) on simulated 2x H100 80GB and 2x H200,
plans the chat recipe (chat-h100 / chat-h200) at tensor_parallel_size 1 and 2 with qlift's planner, and
computes what vLLM 0.26.0 would log per worker from its source:

    available = ceil(total x gpu_memory_utilization) - weights/TP - peak activation - non-torch memory
                (v1/worker/gpu_worker.py determine_available_memory; utils request_memory)
    page      = 2 x block_size 16 x (kv_heads / TP) x head_dim x 2 B          (kv_cache_interface)
    blocks    = available // page // layers, the minimum over the TP workers  (kv_cache_utils get_num_blocks)
    "GPU KV cache size: N tokens"            N = blocks x 16
    "Maximum concurrency for L tokens ...":  blocks / ceil(L / 16)

Assumptions (not measured at TP=2). The peak activation comes from the H200 run (docs/gpu.md section 1,
benchmarks/results/h200-2026-12-01, Qwen2.5-7B shape, 1024 sequences: 1.13 GiB at 8192 batched tokens, 2.15
GiB at 16384). vLLM's profile_run runs the forward pass over max_num_batched_tokens, then the sampler over
max_num_seqs rows, so its peak is the larger of the two: the forward at 2.15 GiB per 16384 tokens scaled by the
per-GPU width (hidden + intermediate/TP) against the 7B's, and the sampler at 1.13 GiB per 1024 sequences of a
152,064 vocabulary (logits are gathered whole on every rank); both points fit that reading (the 7B's forward
at 8192 tokens, 1.08 GiB, is under the sampler's 1.13). Non-torch memory is the run's 0.22 GiB, plus
NCCL_ASSUMED per GPU when TP > 1. The first row checks the formula against that run's own log.

    .venv/bin/python benchmarks/gpu/tp2_plan.py [-o tp2-plan.json]
    python3 benchmarks/gpu/tp2_plan.py --write-model 32b /tmp/qwen32b-shape   # for vLLM on two GPUs (dummy load)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

GiB = 1024**3
BLOCK = 16  # vLLM 0.26's block size for full attention on Hopper (the H200 log: 2,096,192 = 131,012 x 16)
QWEN7B = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
          "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False}
QWEN14B = {"hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
           "intermediate_size": 13824, "vocab_size": 152064, "tie_word_embeddings": False}
QWEN32B = {**QWEN14B, "num_hidden_layers": 64, "intermediate_size": 27648}
FORWARD_PER_TOKEN_7B = 2.15 * GiB / 16384  # vLLM's "peak activation" at 16384 batched tokens, 7B, TP=1, H200
SAMPLER_PER_SEQ_ROW = 1.13 * GiB / (1024 * 152_064)  # its peak at 8192 tokens and 1024 sequences: the sampler's
MEASURED_NON_TORCH = 0.22 * GiB
NCCL_ASSUMED = 0.25 * GiB  # NCCL communicator + custom all-reduce buffers per GPU at TP=2: not measured
H200_TORCH_TOTAL = 139.8 * GiB  # what vLLM saw on the lent H200 ("139.29/139.8 GiB")


def _width(cfg: dict[str, Any], tp: int) -> int:
    return cfg["hidden_size"] + cfg["intermediate_size"] // tp


def vllm_figures(cfg: dict[str, Any], weights_per_gpu: int, *, total: int, util: float, tp: int,
                 batched_tokens: int, seqs: int, max_model_len: int) -> dict[str, Any]:
    """vLLM 0.26.0's per-worker KV cache, from its formulas and the assumptions above."""
    forward = batched_tokens * FORWARD_PER_TOKEN_7B * _width(cfg, tp) / _width(QWEN7B, 1)
    peak = int(max(forward, seqs * cfg["vocab_size"] * SAMPLER_PER_SEQ_ROW))
    non_torch = int(MEASURED_NON_TORCH + (NCCL_ASSUMED if tp > 1 else 0))
    available = math.ceil(total * util) - weights_per_gpu - peak - non_torch
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    page = 2 * BLOCK * max(1, cfg["num_key_value_heads"] // tp) * head_dim * 2
    blocks = max(0, available // page // cfg["num_hidden_layers"])
    return {"available_gib": round(available / GiB, 2), "peak_activation_gib": round(peak / GiB, 2),
            "non_torch_gib": round(non_torch / GiB, 2), "kv_tokens": blocks * BLOCK,
            "max_concurrency": round(blocks / math.ceil(max_model_len / BLOCK), 2)}


def weights_per_gpu(md: Any, tp: int) -> int:
    """vLLM shards every linear layer, the embedding and lm_head over TP; the RMSNorm weights are replicated."""
    return sum(t.nbytes if t.name.endswith("norm.weight") else t.nbytes // tp for t in md.tensors.values())


def rows(root: Path) -> list[dict[str, Any]]:
    from test_plan import shaped_model

    from qlift.hardware import simulate
    from qlift.serve.plan import fit_tensor_parallel, fit_to_model, plan_memory
    from qlift.serve.recipes import load_recipe, with_engine

    out: list[dict[str, Any]] = []
    q7 = shaped_model(root / "qwen7b", QWEN7B)
    check = vllm_figures(QWEN7B, weights_per_gpu(q7, 1), total=int(H200_TORCH_TOTAL), util=0.92, tp=1,
                         batched_tokens=16384, seqs=1024, max_model_len=32768)
    out.append({"shape": "Qwen2.5-7B (formula check)", "gpus": "1x H200 (139.8 GiB, the lent one)", "tp": 1,
                "vllm_formula": check, "vllm_logged_kv_tokens": 2_096_192,
                "formula_over_log": round(check["kv_tokens"] / 2_096_192, 4)})
    for shape, cfg in (("Qwen2.5-14B", QWEN14B), ("Qwen2.5-32B", QWEN32B)):
        md = shaped_model(root / shape, cfg)
        for gpu, base in (("H100", "chat-h100"), ("H200", "chat-h200")):
            hw, recipe = simulate(gpu, 2), load_recipe(base)
            auto, _ = fit_tensor_parallel(recipe, md, hw)
            for tp in (1, 2):
                r, _ = fit_to_model(with_engine(recipe, recipe.engine.model_copy(
                    update={"tensor_parallel_size": tp}), path="tp2_plan"), md)
                p = plan_memory(md, r, hw)
                v = vllm_figures(cfg, weights_per_gpu(md, tp), total=hw.gpus[0].memory_bytes,
                                 util=p.gpu_memory_utilization, tp=tp, batched_tokens=p.max_num_batched_tokens,
                                 seqs=p.max_num_seqs, max_model_len=p.max_model_len)
                out.append({
                    "shape": shape, "gpus": f"2x {gpu} ({hw.gpus[0].memory_bytes / GiB:.1f} GiB, simulated)",
                    "recipe": base, "tp": tp, "auto_picks_tp": auto.tensor_parallel_size,
                    "plan": {"verdict": str(p.verdict), "kv_gib": round(p.kv_cache_bytes / GiB, 2),
                             "activation_gib": round(p.activation_bytes / GiB, 2),
                             "graphs_and_overhead_gib": round((p.cuda_graph_bytes + p.overhead_bytes) / GiB, 2),
                             "kv_tokens": p.kv_capacity_tokens, "max_concurrency": p.concurrent_sequences},
                    "vllm_formula": v,
                    "plan_over_vllm_tokens": round(p.kv_capacity_tokens / v["kv_tokens"], 4),
                    "plan_over_vllm_concurrency": round(p.concurrent_sequences / v["max_concurrency"], 4),
                })
    return out


def write_model(root: Path, cfg: dict[str, Any]) -> Path:
    """Config, Qwen tokenizer and header-only safetensors of this shape: what vLLM loads with load_format=dummy
    (benchmarks/gpu/build_model.py does the same for the 7B)."""
    from substrate import build_qwen_tokenizer, qwen2_tensors, write_header_only_safetensors
    from transformers import Qwen2Config

    root.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {"max_position_embeddings": 32768, "rope_theta": 1e6, "dtype": "bfloat16",
                             "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151645}
    Qwen2Config(**cfg, **extra).save_pretrained(root)
    write_header_only_safetensors(root / "model.safetensors", qwen2_tensors(cfg))
    build_qwen_tokenizer(root)
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", type=Path)
    ap.add_argument("--write-model", nargs=2, metavar=("SHAPE", "DIR"), help="14b or 32b, and where; then exit.")
    a = ap.parse_args()
    if a.write_model:
        shape, out = a.write_model
        print(write_model(Path(out), {"14b": QWEN14B, "32b": QWEN32B}[shape]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        result = rows(Path(tmp))
    first, *plans = result
    print(f"{first['shape']} on {first['gpus']}: formula {first['vllm_formula']['kv_tokens']:,} tokens, "
          f"vLLM logged {first['vllm_logged_kv_tokens']:,}: {first['formula_over_log']}x")
    for r in plans:
        p, v = r["plan"], r["vllm_formula"]
        print(f"{r['shape']} {r['gpus']} TP={r['tp']} (auto picks {r['auto_picks_tp']}): plan {p['kv_tokens']:,} "
              f"tokens / {p['max_concurrency']}x, vLLM formula {v['kv_tokens']:,} / {v['max_concurrency']}x: "
              f"{r['plan_over_vllm_tokens']}x tokens, {r['plan_over_vllm_concurrency']}x concurrency")
    if a.output:
        a.output.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
