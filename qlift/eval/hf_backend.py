"""The transformers backend: the fallback when vLLM is not installed. In-process, one prompt at a time."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

from qlift.errors import ExternalToolError, QliftError
from qlift.eval.backend import Backend
from qlift.eval.generation import EvalModel, Generation, OnResult, Request, Sampling
from qlift.models.chat import prompt_token_ids
from qlift.progress import bar

log = logging.getLogger(__name__)


class TransformersBackend(Backend):
    name = "transformers"

    def generate(self, model: EvalModel, requests: list[Request], sampling: Sampling,
                 on_result: OnResult | None = None) -> list[Generation]:
        try:
            return self._generate(model, requests, sampling)
        except QliftError:
            raise
        except Exception as exc:  # any failure of the backend fails the evaluation
            raise ExternalToolError(
                f"transformers failed on the {model.role} model {model.name}: {type(exc).__name__}: {exc}",
                hint="Rerun with --debug for the traceback.", tool="transformers",
            ) from exc

    def _generate(self, model: EvalModel, requests: list[Request], sampling: Sampling) -> list[Generation]:
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
            ids = prompt_token_ids(tok, asdict(req))
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
