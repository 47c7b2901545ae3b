"""What an evaluation can be asked to do besides CANDIDATE: the one definition ``evaluate``
takes and ``qlift eval``'s options are generated from; its own checks (limits, ``judge``'s target and
baseline) run on construction, so the CLI and a release's eval stage meet the same rule (errors name the field
in backquotes; the CLI names its flag)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from qlift.errors import BadInputError
from qlift.options import Range, check_fields


@dataclass(frozen=True)
class EvalOptions:
    prompts: Path
    """Prompt set, JSONL (see docs/eval.md)."""
    baseline: str | None = None
    """Model to compare with (a directory; a served name with --backend endpoint)."""
    backend: str | None = field(default=None, metadata={"choices": (None, "vllm", "endpoint", "transformers")})
    """How to generate. Default: endpoint if --endpoint is given, else vllm (transformers without vLLM)."""
    endpoint: str | None = field(default=None, metadata={"url": True})
    """Base URL of an OpenAI-compatible server serving the candidate."""
    model_name: str | None = field(default=None, metadata={"flag": "--model"})
    """Served name of the candidate at --endpoint (default: CANDIDATE)."""
    baseline_endpoint: str | None = field(default=None, metadata={"url": True})
    """Server of the baseline, if not --endpoint."""
    metrics: str | None = None
    """Comma-separated subset: ppl,exact_match,rougeL,chrF,json_valid,schema_pass,check_pass,length,latency,
    repetition,loops,off_language,refusal (default: all that apply)."""
    engine_sets: tuple[str, ...] = field(default=(), metadata={"flag": "--set", "metavar": "KEY=VALUE"})
    """A vLLM engine argument for the candidate (vllm backend; vLLM's name), e.g. --set kv_cache_dtype=fp8 to
    evaluate it as `qlift serve` would run it with an FP8 KV cache. Written into the report; a passing gated
    report lets `qlift serve --recipe auto` turn that setting on (docs/serve.md). Repeatable."""
    gates: tuple[str, ...] = field(default=(), metadata={"flag": "--gate", "metavar": "EXPR"})
    """Release gate, repeatable, e.g. 'rougeL >= baseline - 0.02'. Any failure exits 10."""
    report_dir: Path | None = field(default=None, metadata={"flag": "--report"})
    """Write report.json, report.md and report.html into this new directory."""
    force: bool = False
    """Replace an existing --report directory."""
    max_tokens: Annotated[int, Range(ge=1, le=1 << 20)] = 64
    """Greedy output tokens per prompt."""
    resamples: Annotated[int, Range(ge=100, le=100_000)] = field(default=1000, metadata={"flag": "--bootstrap"})
    """Paired bootstrap resamples."""
    seed: Annotated[int, Range(ge=0, le=2**63 - 1)] = 0
    """Seed of the bootstrap (and of sampling)."""
    use_cache: bool = field(default=True, metadata={"flag": "--no-cache"})
    """Reuse cached generations; --no-cache generates again instead."""
    concurrency: Annotated[int, Range(ge=1, le=1024)] = 1
    """Parallel requests (endpoint backend)."""
    max_model_len: Annotated[int, Range(ge=16, le=1 << 24)] = 4096
    """vLLM context length (vllm backend)."""
    api_key: str | None = field(default=None, metadata={"envvar": "QLIFT_EVAL_API_KEY"})
    """Bearer token for the endpoint (env QLIFT_EVAL_API_KEY)."""

    refusal_patterns: Path | None = None
    """More refusal patterns for the refusal metric: a file, one regular expression a line (beside the shipped ones
    of 18 languages)."""
    judge: str | None = field(default=None, metadata={"metavar": "URL#MODEL"})
    """A judge model (OpenAI-compatible) compares the candidate's and the baseline's answers to each prompt, asked
    twice with the order swapped; needs --baseline."""
    judge_pairs: Annotated[int, Range(ge=1, le=100_000)] = 64
    """Prompts the judge compares (an even sample)."""
    judge_rubric: Path | None = None
    """The judge's instructions, a text file (default: qlift's rubric, docs/eval.md)."""
    score_with_baseline: bool = False
    """Score both models' answers under the baseline model: each answer's mean negative log-likelihood per token
    after its prompt (the rollout's stable_reads check, offline), candidate against baseline with a bootstrap CI;
    needs --baseline."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.judge is not None:
            from qlift.quality.judge import parse_target

            parse_target(self.judge)
            if self.baseline is None:
                raise BadInputError("`judge` compares the candidate with the baseline, but no `baseline` was given",
                                    field="judge", hint="Pass `baseline` MODEL, or leave `judge` out.")
        if self.score_with_baseline and self.baseline is None:
            raise BadInputError("`score_with_baseline` scores the answers under the baseline, but no `baseline` was "
                                "given", field="score_with_baseline", hint="Pass `baseline` MODEL.")
