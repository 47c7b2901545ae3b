"""Generate for one model with vLLM offline: ``python -m qlift.eval.vllm_worker JOB.json``.

vLLM spawns an engine process and needs the ``__main__`` guard, so qlift runs it here, in a
child process of its own. The job names the model, the requests, the sampling and the
result path; the result is a JSON file. Generation and reference scoring go out as one
batched ``llm.generate`` call.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _render(tok: Any, req: dict[str, Any]) -> list[int]:
    if req.get("messages") is not None:
        if not getattr(tok, "chat_template", None):
            raise ValueError("the model has no chat template, so 'messages' cannot be rendered; use 'prompt'")
        text = tok.apply_chat_template(req["messages"], add_generation_prompt=True, tokenize=False)
        return list(tok(text, add_special_tokens=False)["input_ids"])
    return list(tok(req["prompt"])["input_ids"])


def run(job: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.monotonic()
    llm = LLM(
        model=job["model"], enforce_eager=True, max_model_len=job["max_model_len"],
        disable_log_stats=False, seed=job["sampling"]["seed"],
    )
    load_s = time.monotonic() - t0
    tok = llm.get_tokenizer()
    s = job["sampling"]
    gen_params = SamplingParams(temperature=s["temperature"], max_tokens=s["max_tokens"], seed=s["seed"])
    score_params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    prompts: list[Any] = []
    params: list[Any] = []
    scored: list[tuple[int, int]] = []  # (request index, reference token count)
    for req in job["requests"]:
        ids = _render(tok, req)
        prompts.append(TokensPrompt(prompt_token_ids=ids))
        params.append(gen_params)
    for i, req in enumerate(job["requests"]):
        if req.get("reference"):
            ids = _render(tok, req)
            ref = list(tok(req["reference"], add_special_tokens=False)["input_ids"])
            prompts.append(TokensPrompt(prompt_token_ids=ids + ref))
            params.append(score_params)
            scored.append((i, len(ref)))
    t1 = time.monotonic()
    outs = llm.generate(prompts, params, use_tqdm=False)
    gen_s = time.monotonic() - t1
    n = len(job["requests"])
    gens: list[dict[str, Any]] = []
    for o in outs[:n]:
        c = o.outputs[0]
        m = o.metrics
        latency = (m.last_token_ts - m.queued_ts) if m is not None and m.last_token_ts else gen_s
        gens.append({
            "text": c.text, "output_tokens": len(c.token_ids), "latency_s": latency,
            "finish_reason": c.finish_reason, "ref_logprob": None, "ref_tokens": None,
        })
    for (i, nref), o in zip(scored, outs[n:], strict=True):
        ids = o.prompt_token_ids or []
        plp = o.prompt_logprobs or []
        total = 0.0
        for pos in range(len(ids) - nref, len(ids)):
            total += plp[pos][ids[pos]].logprob  # type: ignore[index]
        gens[i]["ref_logprob"] = total
        gens[i]["ref_tokens"] = nref
    import vllm

    return {"generations": gens, "load_s": load_s, "generate_s": gen_s, "vllm_version": vllm.__version__}


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    result_path = Path(job["result"])
    try:
        result = run(job)
    except Exception as exc:  # reported to the parent as data, with the traceback in the log
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"}
    from qlift.fsutil import write_json_atomic

    write_json_atomic(result_path, result, indent=None)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip vLLM's graceful engine teardown (seconds): the parent kills this process group.
    os._exit(code)
