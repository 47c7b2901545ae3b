"""Train a real LoRA fine-tune of SmolLM2-135M-Instruct on the CPU: support tickets -> JSON.

The task, generated here from templates with a fixed seed: read a short customer-support
dialogue and answer with one JSON object, exactly

    {"intent": "refund" | "shipping" | "account" | "cancel" | "technical",
     "order_id": "A" + 5 digits, or null,
     "priority": "low" | "normal" | "urgent",
     "product": a product name from the dialogue}

The base model answers in prose or invents keys; the adapter learns the schema. Held-out
prompts come from a disjoint set of products, names and phrasings (never seen in
training) and carry the schema as a check, so `qlift eval` measures JSON validity, schema
pass and ROUGE-L against the base with bootstrap CIs.

    python examples/train_adapter.py                      # writes examples/adapter/ + held-out prompts
    python examples/train_adapter.py --steps 20 -o /tmp/a # a quick smoke run

The shipped adapter was trained with the defaults below; examples/README.md records the
run (seed, steps, data size, loss curve, wall time).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SYSTEM = "Triage the ticket. Answer with JSON only: intent, order_id, priority, product."
SCHEMA = {
    "type": "object",
    "properties": {
        "intent": {"enum": ["refund", "shipping", "account", "cancel", "technical"]},
        "order_id": {"anyOf": [{"type": "string", "pattern": "^A[0-9]{5}$"}, {"type": "null"}]},
        "priority": {"enum": ["low", "normal", "urgent"]},
        "product": {"type": "string", "minLength": 1},
    },
    "required": ["intent", "order_id", "priority", "product"],
    "additionalProperties": False,
}

# Disjoint pools: training draws from the first part of each list, held-out from the rest.
PRODUCTS = ["desk lamp", "coffee grinder", "yoga mat", "rain jacket", "phone case", "standing desk",
            "electric kettle", "hiking boots", "bluetooth speaker", "office chair", "water bottle",
            "air fryer", "wool blanket", "gaming mouse", "travel backpack", "smart watch",
            "baby stroller", "garden hose", "camping tent", "tea set"]
NAMES = ["Maria", "Tom", "Aisha", "Kenji", "Lena", "Omar", "Priya", "Jonas", "Chen", "Sofia", "Lucas", "Nadia"]
INTENT_LINES = {
    "refund": ["I want my money back for the {p}.", "Can I get a refund on the {p}? It broke after a week.",
               "The {p} is not what I ordered, please refund me.", "Please return the {p} and refund the charge.",
               "I was charged twice for the {p}, I need a refund.", "The {p} arrived damaged and I want a refund."],
    "shipping": ["Where is my {p}? It was supposed to arrive on Monday.", "My {p} has not shipped yet.",
                 "The tracking for my {p} has not moved in days.", "Can you send the {p} to my new address?",
                 "The courier says the {p} was delivered but I never got it.", "When will the {p} be shipped?"],
    "account": ["I cannot log in to order another {p}.", "Please change the email on my account, I bought a {p}.",
                "My password reset link for the store does not work; I need to reorder the {p}.",
                "How do I delete my account? I only bought one {p}.", "Someone else used my account to buy a {p}.",
                "I want to update the card on my account before the {p} renews."],
    "cancel": ["Please cancel my order for the {p}.", "I changed my mind about the {p}, cancel it.",
               "Cancel the {p} before it ships, please.", "I ordered the {p} by mistake, cancel the order.",
               "Stop my {p} order, I found it cheaper elsewhere.", "Can you cancel the {p} I just ordered?"],
    "technical": ["The {p} will not turn on.", "My {p} keeps disconnecting.", "The {p} makes a loud noise.",
                  "The app does not find my {p}.", "The {p} stopped working after the update.",
                  "The display on the {p} flickers."],
}
URGENT = ["This is urgent, I need it today!", "Please hurry, this is really urgent.", "I need this fixed now!"]
LOW = ["No rush.", "Whenever you have time.", "It is not urgent."]
AGENT = ["Hello, thanks for contacting support. How can I help?", "Hi! What can I do for you today?",
         "Good day, support here. What is the issue?", "Hi there, how can we help?"]


def make_ticket(rng: random.Random, held_out: bool) -> tuple[str, dict[str, object]]:
    split = slice(14, None) if held_out else slice(0, 14)
    products, names = PRODUCTS[split], NAMES[8:] if held_out else NAMES[:8]
    intent = rng.choice(sorted(INTENT_LINES))
    lines = INTENT_LINES[intent]
    line = rng.choice(lines[4:] if held_out else lines[:4])
    product = rng.choice(products)
    order_id = f"A{rng.randrange(10_000, 100_000)}" if rng.random() < 0.7 else None
    priority = rng.choice(["low", "normal", "normal", "urgent"])
    said = line.format(p=product)
    if order_id:
        said += f" My order number is {order_id}."
    said += {"urgent": " " + rng.choice(URGENT), "low": " " + rng.choice(LOW), "normal": ""}[priority]
    dialogue = f"Agent: {rng.choice(AGENT)}\nCustomer ({rng.choice(names)}): {said}"
    answer = {"intent": intent, "order_id": order_id, "priority": priority, "product": product}
    return dialogue, answer


def messages(dialogue: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": dialogue}]


def write_held_out(path: Path, n: int, seed: int) -> None:
    rng = random.Random(seed + 1)
    rows = []
    for i in range(n):
        dialogue, answer = make_ticket(rng, held_out=True)
        rows.append({"id": f"ticket-{i:03d}", "messages": messages(dialogue), "reference": json.dumps(answer),
                     "checks": {"json_schema": SCHEMA}, "tags": ["json", str(answer["intent"])]})
    header = ("# Held-out support tickets for the demo's fine-tune (examples/train_adapter.py); never used in\n"
              "# training: disjoint products, customer names and phrasings. reference = the expected JSON.\n")
    path.write_text(header + "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def json_answer(answer: dict[str, object]) -> str:
    """What the fine-tune learns to say for a ticket: the JSON, then the end of its turn."""
    return json.dumps(answer) + "<|im_end|>"


def train(base: Path, out: Path, *, steps: int, batch: int, lr: float, rank: int, seed: int,
          train_size: int, bf16: bool, device: str = "cpu",
          answer_text: Callable[[dict[str, object]], str] = json_answer, targets: tuple[str, ...] = ALL_LINEAR,
          note: str = "") -> dict[str, object]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    # A .gguf base is dequantized by transformers, exactly as `qlift import-gguf` does.
    where, gguf = (base.parent, {"gguf_file": base.name}) if base.suffix == ".gguf" else (base, {})
    tok = AutoTokenizer.from_pretrained(where, **gguf)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **gguf).to(device)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, task_type="CAUSAL_LM",
                     target_modules=list(targets))
    model = get_peft_model(model, cfg)
    data = []
    for _ in range(train_size):  # prompt tokens are masked out of the loss: only the answer is learned
        dialogue, answer = make_ticket(rng, held_out=False)
        prompt = tok.apply_chat_template(messages(dialogue), add_generation_prompt=True, tokenize=False)
        ids_p = tok(prompt, add_special_tokens=False)["input_ids"]
        ids_a = tok(answer_text(answer), add_special_tokens=False)["input_ids"]
        data.append((ids_p + ids_a, [-100] * len(ids_p) + ids_a))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10) * max(0.0, 1 - s / steps))
    curve: list[tuple[int, float]] = []
    model.train()
    t0 = time.monotonic()
    for step in range(steps):
        rows = [data[(step * batch + k) % len(data)] for k in range(batch)]
        width = max(len(ids) for ids, _ in rows)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows], device=device)
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows], device=device)
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows], device=device)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % 10 == 0 or step == steps - 1:
            value = float(loss.detach())
            curve.append((step, round(value, 4)))
            print(f"step {step:4d}  loss {value:.4f}  {time.monotonic() - t0:6.0f} s", flush=True)
    model.peft_config["default"].base_model_name_or_path = "SmolLM2-135M-Instruct"  # not a local path
    model.save_pretrained(out)  # the adapter only: the vocabulary is the base's, unchanged
    record = {"base": "SmolLM2-135M-Instruct (qlift import-gguf --builtin smollm2)", "note": note, "seed": seed,
              "steps": steps,
              "batch": batch, "lr": lr, "rank": rank, "alpha": 2 * rank, "train_examples": train_size,
              "targets": cfg.target_modules and sorted(cfg.target_modules), "loss_curve": curve,
              "autocast_bf16": bf16, "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
              "wall_s": round(time.monotonic() - t0, 1), "torch": torch.__version__}
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="SmolLM2 model dir or .gguf (default: qlift's converted built-in)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda where there is a GPU")
    ap.add_argument("-o", "--out", type=Path, default=HERE / "adapter")
    ap.add_argument("--prompts", type=Path, default=HERE / "prompts" / "tickets-heldout.jsonl")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=6)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--train-size", type=int, default=600)
    ap.add_argument("--held-out", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (slower than fp32 on the CPUs tried)")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    base = args.base
    if base is None:
        from qlift.models.gguf_import import ensure_builtin

        base, _ = ensure_builtin("smollm2")
    write_held_out(args.prompts, args.held_out, args.seed)
    record = train(base, args.out, steps=args.steps, batch=args.batch, lr=args.lr, rank=args.rank,
                   seed=args.seed, train_size=args.train_size, bf16=args.bf16, device=args.device)
    print(json.dumps({k: v for k, v in record.items() if k != "loss_curve"}))


if __name__ == "__main__":
    main()
