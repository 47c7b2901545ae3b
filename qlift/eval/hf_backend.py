"""The transformers backend: the fallback when vLLM is not installed. In-process, one prompt at a time."""

from __future__ import annotations

import logging
import time
from typing import Any

from qlift.errors import ExternalToolError
from qlift.eval.generation import Generation, ModelRef, OnResult, Request, Sampling
from qlift.progress import bar

log = logging.getLogger(__name__)


def _prompt_ids(tok: Any, req: Request) -> list[int]:
    if req.messages is not None:
        if not getattr(tok, "chat_template", None):
            raise ExternalToolError(
                "the model has no chat template, so 'messages' cannot be rendered",
                hint="Use 'prompt' in the prompt file for this model.", tool="transformers",
            )
        text = tok.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=False)
        return list(tok(text, add_special_tokens=False)["input_ids"])
    return list(tok(req.prompt)["input_ids"])


class TransformersBackend:
    name = "transformers"
    supports_ppl = True

    def generate(self, model: ModelRef, requests: list[Request], sampling: Sampling,
                 on_result: OnResult | None = None) -> list[Generation]:
        try:
            return self._generate(model, requests, sampling)
        except ExternalToolError:
            raise
        except Exception as exc:  # any failure of the backend fails the evaluation
            raise ExternalToolError(
                f"transformers failed on the {model.role} model {model.name}: {type(exc).__name__}: {exc}",
                hint="Rerun with --debug for the traceback.", tool="transformers",
            ) from exc

    def _generate(self, model: ModelRef, requests: list[Request], sampling: Sampling) -> list[Generation]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(sampling.seed)
        assert model.path is not None
        tok = AutoTokenizer.from_pretrained(model.path)
        lm: Any = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32)
        lm.eval()
        eos = lm.generation_config.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else (eos if isinstance(eos, int) else 0)
        out: list[Generation] = []
        for req in bar(requests, total=len(requests), desc=f"transformers {model.role}"):
            ids = _prompt_ids(tok, req)
            x = torch.tensor([ids])
            t0 = time.monotonic()
            with torch.no_grad():
                y = lm.generate(
                    x, attention_mask=torch.ones_like(x), max_new_tokens=sampling.max_tokens,
                    do_sample=False, pad_token_id=pad,
                )
            latency = time.monotonic() - t0
            new = y[0, len(ids):].tolist()
            n_new = len(new)  # counted with the end-of-turn token, as vLLM counts them
            finish = "length" if n_new >= sampling.max_tokens else "stop"
            stops = eos if isinstance(eos, list) else [eos]
            if new and new[-1] in stops:
                new = new[:-1]
            gen = Generation(
                text=str(tok.decode(new, skip_special_tokens=True)), output_tokens=n_new,
                latency_s=latency, finish_reason=finish,
            )
            if req.reference:
                ref = list(tok(req.reference, add_special_tokens=False)["input_ids"])
                full = torch.tensor([ids + ref])
                with torch.no_grad():
                    logits = lm(full).logits[0, len(ids) - 1 : -1].float()
                lp = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ref)[:, None])
                gen.ref_logprob = float(lp.sum())
                gen.ref_tokens = len(ref)
            out.append(gen)
        return out
