"""qlift eval's transformers backend: prompts in left-padded batches against one at a time.

The backend is the eval's fallback where vLLM cannot serve the model (an AWQ checkpoint on a CPU
without AVX-512, where it was the bulk of `make demo`'s time). Both runs generate greedy answers for
the same held-out prompts with the same model in this process, one after the other; prints the
seconds of each, the same-run ratio, and whether every answer (text, token count, finish reason,
reference log-probability) is the same, with the CPU.

    .venv/bin/python benchmarks/eval_batch.py [--model DIR] [--prompts 16] [--batch 16] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(model: Path, prompts: int, batch: int, max_tokens: int) -> tuple[float, list[tuple[object, ...]]]:
    from qlift.eval import hf_backend
    from qlift.eval.generation import EvalModel, Request, Sampling
    from qlift.eval.prompts import load_prompts
    from qlift.models.ref import ModelRef

    examples = load_prompts(REPO / "examples" / "prompts" / "tickets-heldout.jsonl")[:prompts]
    reqs = [Request.of(e) for e in examples]
    hf_backend.BATCH = batch
    t0 = time.monotonic()
    gens = hf_backend.TransformersBackend().generate(
        EvalModel(role="candidate", name=model.name, ref=ModelRef(base=model, adapters=(), content_hash="bench")), reqs,
        Sampling(max_tokens=max_tokens))
    return time.monotonic() - t0, [(g.text, g.output_tokens, g.finish_reason, round(g.ref_logprob or 0, 3))
                                   for g in gens]


def main() -> None:
    from qlift.hardware import detect_cpu
    from qlift.models.gguf_import import ensure_builtin

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="a model dir, e.g. an AWQ checkpoint (default: the built-in SmolLM2)")
    p.add_argument("--prompts", type=int, default=16, help="how many of examples/prompts/tickets-heldout.jsonl")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    model = (args.model or ensure_builtin("smollm2")[0]).resolve()
    cpu = detect_cpu()
    print(f"CPU: {cpu.model}, {cpu.cores} cores, {cpu.vector_isa}; model {model}", flush=True)
    batched_s, batched = run(model, args.prompts, args.batch, args.max_tokens)
    print(f"batch {args.batch:3}: {batched_s:6.1f} s", flush=True)
    serial_s, serial = run(model, args.prompts, 1, args.max_tokens)
    print(f"batch   1: {serial_s:6.1f} s", flush=True)
    same = sum(a == b for a, b in zip(batched, serial, strict=True))
    print(f"one at a time / batched: {serial_s / batched_s:.2f}x; answers the same: {same} of {len(serial)} "
          f"({args.prompts} prompts x {args.max_tokens} tokens, {cpu.model}, {cpu.vector_isa})")


if __name__ == "__main__":
    main()
