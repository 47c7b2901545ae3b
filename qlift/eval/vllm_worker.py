"""Generate for one model with vLLM offline: ``python -m qlift.eval.vllm_worker JOB.json``.

vLLM spawns an engine process and needs the ``__main__`` guard, so qlift runs it here, in a
child process of its own. The job names the model, the requests, the sampling and the
result path; the result is a JSON file. Generation and reference scoring go out as one
batched ``llm.generate`` call.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, cast

from qlift.eval.generation import Generation
from qlift.eval.vllm_job import VllmEvalJob, VllmEvalResult
from qlift.models.chat import prompt_token_ids
from qlift.vllm.worker import die_with_group, exit_now, read_job, run_and_report


def run(raw: dict[str, Any]) -> dict[str, Any]:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    job = VllmEvalJob.model_validate(raw)
    if job.threads:  # the engine runs in this process (qlift.perf.engine.in_process_threads)
        import torch

        torch.set_num_threads(job.threads)
    s = job.sampling
    t0 = time.monotonic()
    llm = LLM(model=job.model, enforce_eager=True, max_model_len=job.max_model_len, disable_log_stats=False,
              seed=s.seed, dtype=cast(Any, job.dtype), **job.engine_args)
    load_s = time.monotonic() - t0
    tok = llm.get_tokenizer()
    gen_params = SamplingParams(temperature=s.temperature, max_tokens=s.max_tokens, seed=s.seed)
    score_params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    prompts: list[Any] = []
    params: list[Any] = []
    scored: list[tuple[int, int]] = []  # (request index, reference token count)
    # Tools go into the chat template, as llm.chat(tools=) would; the model's <tool_call> text is read by the metric.
    rendered = [prompt_token_ids(tok, {"messages": r.messages, "prompt": r.prompt, "tools": r.tools})
                for r in job.requests]
    for ids in rendered:
        prompts.append(TokensPrompt(prompt_token_ids=ids))
        params.append(gen_params)
    for i, (req, ids) in enumerate(zip(job.requests, rendered, strict=True)):
        if req.reference:
            ref = list(tok(req.reference, add_special_tokens=False)["input_ids"])
            prompts.append(TokensPrompt(prompt_token_ids=ids + ref))
            params.append(score_params)
            scored.append((i, len(ref)))
    t1 = time.monotonic()
    outs = llm.generate(prompts, params, use_tqdm=True)  # its bar in the log is qlift's progress (logview)
    gen_s = time.monotonic() - t1
    n = len(job.requests)
    gens: list[Generation] = []
    for o in outs[:n]:
        c = o.outputs[0]
        m = o.metrics
        latency = (m.last_token_ts - m.queued_ts) if m is not None and m.last_token_ts else gen_s
        gens.append(Generation(text=c.text, output_tokens=len(c.token_ids), latency_s=latency,
                               finish_reason=c.finish_reason))
    for (i, nref), o in zip(scored, outs[n:], strict=True):
        ids = o.prompt_token_ids or []
        plp = o.prompt_logprobs or []
        total = 0.0
        for pos in range(len(ids) - nref, len(ids)):
            total += plp[pos][ids[pos]].logprob  # type: ignore[index]
        gens[i].ref_logprob = total
        gens[i].ref_tokens = nref
    result = VllmEvalResult(generations=gens, load_s=load_s, generate_s=gen_s, vllm_version=vllm.__version__)
    return result.model_dump(mode="json")


def main(argv: list[str]) -> int:
    die_with_group()
    return run_and_report(run, read_job(Path(argv[1])))


if __name__ == "__main__":
    exit_now(main(sys.argv))
