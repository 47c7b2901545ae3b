"""What an evaluation can be asked to do besides CANDIDATE: the one definition ``evaluate``
takes; ``qlift eval``'s options are checked against it (tests/test_options.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qlift.options import check_fields


@dataclass(frozen=True)
class EvalOptions:
    prompts: Path
    """Prompt set, JSONL (see docs/eval.md)."""
    baseline: str | None = None
    """Model to compare with (a directory; a served name with --backend endpoint)."""
    backend: str | None = field(default=None, metadata={"choices": (None, "vllm", "endpoint", "transformers")})
    """How to generate. Default: endpoint if --endpoint is given, else vllm (transformers without vLLM)."""
    endpoint: str | None = None
    """Base URL of an OpenAI-compatible server serving the candidate."""
    model_name: str | None = None
    """Served name of the candidate at --endpoint (default: CANDIDATE)."""
    baseline_endpoint: str | None = None
    """Server of the baseline, if not --endpoint."""
    metrics: str | None = None
    """Comma-separated subset: ppl,exact_match,rougeL,chrF,json_valid,schema_pass,check_pass,length,latency
    (default: all that apply)."""
    gates: tuple[str, ...] = ()
    """Release gate, repeatable, e.g. 'rougeL >= baseline - 0.02'. Any failure exits 10."""
    report_dir: Path | None = None
    """Write report.json, report.md and report.html into this new directory."""
    force: bool = False
    """Replace an existing --report directory."""
    max_tokens: int = field(default=64, metadata={"min": 1})
    """Greedy output tokens per prompt."""
    resamples: int = field(default=1000, metadata={"min": 100})
    """Paired bootstrap resamples."""
    seed: int = field(default=0, metadata={"min": 0})
    """Seed of the bootstrap (and of sampling)."""
    use_cache: bool = True
    """Read cached generations instead of generating again (--no-cache: generate again)."""
    concurrency: int = field(default=1, metadata={"min": 1})
    """Parallel requests (endpoint backend)."""
    max_model_len: int = field(default=4096, metadata={"min": 16})
    """vLLM context length (vllm backend)."""
    api_key: str | None = None
    """Bearer token for the endpoint (env QLIFT_EVAL_API_KEY)."""

    def __post_init__(self) -> None:
        check_fields(self)
