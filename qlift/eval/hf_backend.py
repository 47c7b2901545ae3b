"""The transformers backend: the fallback where vLLM is not installed or cannot serve the model. In-process,
BATCH prompts at a time (greedy, left-padded): one at a time, a 135M model took 12 min for the demo's
84 answers on two AVX2 cores."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

from qlift.errors import ExternalToolError, QliftError
from qlift.eval.backend import Backend
from qlift.eval.generation import EvalModel, Generation, OnResult, Request, Sampling
from qlift.models.chat import prompt_token_ids
from qlift.progress import counter

log = logging.getLogger(__name__)
BATCH = 16


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
        stops = set(eos if isinstance(eos, list) else [eos])
        pad = tok.pad_token_id if tok.pad_token_id is not None else (eos if isinstance(eos, int) else 0)
        out: list[Generation] = []
        with counter(len(requests), f"transformers {model.role}", unit="prompt") as progress:
            for start in range(0, len(requests), BATCH):
                chunk = requests[start:start + BATCH]
                prompts = [prompt_token_ids(tok, asdict(req)) for req in chunk]
                x, mask = _left_padded(prompts, pad)
                t0 = time.monotonic()
                with torch.no_grad():
                    y = lm.generate(x, attention_mask=mask, max_new_tokens=sampling.max_tokens, do_sample=False,
                                    pad_token_id=pad)
                latency = time.monotonic() - t0  # each answer of the batch waited for the whole batch
                for row, (req, ids) in enumerate(zip(chunk, prompts, strict=True)):
                    out.append(self._answer(lm, tok, req, ids, y[row, x.shape[1]:].tolist(), stops, latency,
                                            sampling))
                progress.update(len(chunk))
        return out

    @staticmethod
    def _answer(lm: Any, tok: Any, req: Request, ids: list[int], new: list[int], stops: set[int], latency: float,
                sampling: Sampling) -> Generation:
        import torch

        # A row that stopped early is padded to the batch's longest: keep up to its first stop token,
        # counted as vLLM counts it.
        end = next((i for i, t in enumerate(new) if t in stops), None)
        n_new = len(new) if end is None else end + 1
        finish = "length" if end is None and n_new >= sampling.max_tokens else "stop"
        gen = Generation(
            text=str(tok.decode(new[:end], skip_special_tokens=True)), output_tokens=n_new,
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
        return gen


def _left_padded(prompts: list[list[int]], pad: int) -> tuple[Any, Any]:
    """The prompts as one left-padded batch and its attention mask (generation continues at the right edge)."""
    import torch

    width = max(len(p) for p in prompts)
    x = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return x, mask
