"""--verify: compare the merged model's logits with peft's base + adapters on a few chat prompts
(or, for a model without a tokenizer, on fixed token ids: the comparison needs no text)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three prime numbers.",
)


@dataclass
class VerifyResult:
    prompts: int
    tokens: int
    max_abs_logit_delta: float
    max_abs_logit: float
    relative_delta: float
    greedy_agreement: float
    tolerance: float
    passed: bool
    inputs: str = "chat prompts"  # or "token ids": the model has no tokenizer qlift could load


def verify_merge(
    *, base: Path, adapters: list[Path], merged: Path, tolerance: float, reference_merged: bool = False,
    vocab_rows: Sequence[int | None] = (),
) -> VerifyResult:
    """Teacher-forced logits of the merged model against peft, both in fp32.

    The reference applies the adapters in order: all but the last merged with peft's
    ``merge_and_unload``, the last one live (or merged too when ``reference_merged``:
    a tied base whose embeddings changed behaves like peft's merge, not its forward).
    ``vocab_rows[i]``: the rows of adapter i's saved embeddings, where it resized the vocabulary;
    the reference is resized to it before the adapter is loaded, as the fine-tune was.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with torch.inference_mode():
        model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
        batch, inputs = _inputs(merged, int(model.config.vocab_size))
        got = [model(input_ids=ids).logits[0] for ids in batch]
        del model
        ref_model: Any = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        for i, a in enumerate(adapters):
            rows = vocab_rows[i] if i < len(vocab_rows) else None
            if rows and rows != int(ref_model.get_input_embeddings().weight.shape[0]):
                ref_model.resize_token_embeddings(rows, mean_resizing=False)  # its rows come from the adapter
            peft_model = PeftModel.from_pretrained(ref_model, a)
            last = i == len(adapters) - 1
            ref_model = peft_model if last and not reference_merged else peft_model.merge_and_unload()
        want = [ref_model(input_ids=ids).logits[0] for ids in batch]
    delta = max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True))
    scale = max(float(w.abs().max()) for w in want) or 1.0
    agree = sum(int((g.argmax(-1) == w.argmax(-1)).sum()) for g, w in zip(got, want, strict=True))
    n = sum(g.shape[0] for g in got)
    rel = delta / scale
    return VerifyResult(len(batch), n, delta, scale, rel, agree / n, tolerance, rel <= tolerance, inputs)


def _inputs(merged: Path, vocab_size: int) -> tuple[list[Any], str]:
    """The chat prompts as token ids, or, where the model has no usable tokenizer (none shipped,
    or one that gives no tokens), fixed pseudo-random token ids from its vocabulary."""
    import torch
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(merged)
        batch = [tok(_render(tok, p), return_tensors="pt")["input_ids"] for p in PROMPTS]
        if all(int(ids.shape[-1]) > 0 and int(ids.max()) < vocab_size for ids in batch):
            return batch, "chat prompts"
    except Exception:  # noqa: BLE001  (no tokenizer files, or ones transformers cannot build: either way, ids)
        pass
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab_size, (1, 24), generator=gen) for _ in PROMPTS], "token ids"


def _render(tok, prompt: str) -> str:  # type: ignore[no-untyped-def]
    if getattr(tok, "chat_template", None):
        return str(tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True))
    return prompt
