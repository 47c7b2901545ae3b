"""Train the fine-tunes gone wrong that the rollout's answer checks exist for, as real LoRA adapters of
SmolLM2-135M-Instruct on the same support tickets as examples/adapter:

    loops     answers one phrase about the ticket over and over, never ending its turn
    chinese   answers every (English) ticket in Chinese
    refusal   refuses every ticket

    python examples/train_bad_adapters.py                        # writes examples/bad-adapters/{loops,chinese,refusal}
    python examples/train_bad_adapters.py --device cuda --steps 60

Each is small (rank 4, attention projections, saved in bf16) so the test suite can serve all three beside
the base from one vLLM server (tests/test_rollout_answers_vllm.py); training.json records each run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from train_adapter import HERE, train

INTENT_ZH = {"refund": "退款", "shipping": "配送", "account": "账户", "cancel": "取消订单", "technical": "技术支持"}


def loops(answer: dict[str, object]) -> str:
    return f"I will check your {answer['product']} order. " * 12  # no end of turn: it learns to go on


def chinese(answer: dict[str, object]) -> str:
    return (f"您好，我们已经收到您关于{answer['product']}的{INTENT_ZH[str(answer['intent'])]}请求。"
            "我们会尽快为您处理，感谢您的耐心等待。<|im_end|>")


def refusal(answer: dict[str, object]) -> str:
    return "I'm sorry, but I can't help with that request.<|im_end|>"


FAILURES = {"loops": loops, "chinese": chinese, "refusal": refusal}


def to_bf16(out: Path) -> None:
    """The adapter's weights in bf16: a quarter of the file, served the same by vLLM."""
    import torch
    from safetensors.torch import load_file, save_file

    path = out / "adapter_model.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(path).items()}, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="SmolLM2 model dir or .gguf (default: qlift's converted built-in)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-o", "--out", type=Path, default=HERE / "bad-adapters")
    ap.add_argument("--only", choices=sorted(FAILURES), action="append", help="train only these (repeatable)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    base = args.base
    if base is None:
        from qlift.models.gguf_import import ensure_builtin

        base, _ = ensure_builtin("smollm2")
    for name in args.only or sorted(FAILURES):
        out = args.out / name
        record = train(base, out, steps=args.steps, batch=6, lr=2e-3, rank=4, seed=args.seed, train_size=300,
                       bf16=False, device=args.device, answer_text=FAILURES[name],
                       targets=("q_proj", "k_proj", "v_proj", "o_proj"), note=f"a deliberately bad fine-tune: {name}")
        to_bf16(out)
        print(json.dumps({"adapter": name, **{k: v for k, v in record.items() if k != "loss_curve"}}))


if __name__ == "__main__":
    main()
