"""What evaluation asks of a backend. The transformers, vllm and endpoint backends each satisfy it."""

from __future__ import annotations

from typing import Protocol

from qlift.eval.generation import EvalModel, Generation, OnResult, Request, Sampling


class Backend(Protocol):
    name: str
    """Part of every cache key: answers from one backend are never served for another."""

    def numerics(self, model: EvalModel) -> str:
        """What besides the model and the request decides the answer's numbers (engine, device, dtype), for the
        cache key: a greedy near-tie tips differently on another kernel path, so answers cached on one machine
        are not read as another's. Empty where the backend cannot tell (a served model)."""
        return ""

    def answers_by(self, model: EvalModel) -> str:
        """Which path produces ``model``'s answers, as the report names it: "transformers", "vLLM, W4A16 kernel",
        "vLLM, weights unpacked from W4A16 to float32". Decided without generating (cached answers are named too)."""
        return self.name

    def identify(self, model: EvalModel) -> None:
        """Record what identifies ``model`` for the cache where no content hash can (a served
        model); a backend of local directories has the content hash and does nothing here."""
        return None

    def generate(self, model: EvalModel, requests: list[Request], sampling: Sampling,
                 on_result: OnResult | None = None) -> list[Generation]:
        """One answer per request, in order. ``on_result`` is called as each answer arrives, by
        backends that answer one request at a time, so a failure later keeps what came before."""
        ...
