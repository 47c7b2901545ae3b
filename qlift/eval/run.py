"""``evaluate``: a candidate against a baseline on a prompt set, end to end.

``run(EvalInputs, EvalOptions) -> EvalResult`` is the stage's entry point (the shape every stage shares);
the baseline, prompts and gates are options, as on the command line."""

from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, ExternalToolError, GateFailedError, IncompatibleError
from qlift.eval.backend import Backend
from qlift.eval.compare import MetricSummary, summarize
from qlift.eval.gates import parse_gate
from qlift.eval.generation import (
    CacheStats,
    EvalModel,
    Generation,
    GenerationCache,
    Request,
    Sampling,
    cached_generate,
)
from qlift.eval.metrics import METRICS, applies, parse_metrics, score
from qlift.eval.options import EvalOptions
from qlift.eval.prompts import Example, load_prompts
from qlift.fsutil import check_output_path
from qlift.gates.grammar import Gate, GateResult
from qlift.models.ref import ModelRef, hash_memo
from qlift.settings import eval_cache_dir, vllm_python

log = logging.getLogger(__name__)
BACKENDS = ("vllm", "endpoint", "transformers")


@dataclass
class ExampleRow:
    id: str
    tags: list[str]
    prompt: str
    reference: str | None
    outputs: dict[str, str]  # role -> text
    scores: dict[str, dict[str, float | None]]  # metric -> role -> value


@dataclass
class EvalResult:
    candidate: EvalModel
    baseline: EvalModel | None
    prompts: str
    examples_count: int
    backend: str
    sampling: Sampling
    metrics: list[str]
    overall: list[MetricSummary]
    slices: dict[str, list[MetricSummary]]
    gates: list[GateResult]
    passed: bool
    examples: list[ExampleRow]
    cache: CacheStats
    bootstrap: dict[str, int]
    notes: list[str] = field(default_factory=list)
    # role -> which path produced its answers: "vLLM, W4A16 kernel", "vLLM, weights unpacked from W4A16 to float32"
    answers: dict[str, str] = field(default_factory=dict)
    report_dir: str | None = None
    seconds: float = 0.0
    latency_warning: str | None = None  # why the latency comparison says little about the models
    judge: dict[str, Any] | None = None  # --judge: win / tie / loss of the candidate against the baseline
    baseline_reads: dict[str, Any] | None = None  # --score-with-baseline: both answers' mean NLL under the baseline

    def summary(self, metric: str, tag: str | None = None) -> MetricSummary | None:
        rows = self.overall if tag is None else self.slices.get(tag, [])
        return next((s for s in rows if s.metric == metric), None)


def pick_backend(backend: str | None, endpoint: str | None) -> str:
    if backend:
        if backend not in BACKENDS:
            raise BadInputError(f"unknown backend '{backend}'", hint=f"Choose one of: {', '.join(BACKENDS)}.")
        if backend == "endpoint" and not endpoint:
            raise BadInputError("`backend` endpoint needs `endpoint` URL", hint="Pass the server's base URL.")
        return backend
    if endpoint:
        return "endpoint"
    if vllm_python() or importlib.util.find_spec("vllm") is not None:
        return "vllm"
    log.info("vLLM is not installed: evaluating with transformers")
    return "transformers"


def _make_backend(name: str, *, concurrency: int, max_model_len: int, api_key: str | None) -> Backend:
    if name == "vllm":
        from qlift.eval.vllm_backend import VllmBackend

        return VllmBackend(max_model_len=max_model_len)
    if name == "endpoint":
        from qlift.eval.endpoint import EndpointBackend

        return EndpointBackend(concurrency=concurrency, api_key=api_key)
    from qlift.eval.hf_backend import TransformersBackend

    return TransformersBackend()


def _local_model(role: str, path_str: str, *, chat: bool, ref: ModelRef | None = None) -> EvalModel:
    """``chat``: the prompts have 'messages', which only a model with a chat template can render; ``ref``: the
    model's ref where the caller has it (its hash is used, not computed again)."""
    from qlift.models import ModelDir

    md = ModelDir.open(path_str)
    md.require_weights()
    if ref is not None and Path(ref.base).resolve() != md.path.resolve():
        ref = None  # the ref of another directory than the one named: hash the one named
    if chat and md.chat_template is None:
        raise IncompatibleError(f"the {role} model {path_str} has no chat template, so the prompt file's "
                                "'messages' cannot be rendered",
                                hint="Use 'prompt' instead of 'messages' for this model.")
    # File hashes remembered: a hand-made checkpoint is hashed once, not per run.
    return EvalModel(role, str(path_str), ref=ref or ModelRef.of(md.path, memo=hash_memo()))


def _check_gates(gates: list[Gate], examples: list[Example], has_baseline: bool, prompts: Path) -> None:
    tags = {t for ex in examples for t in ex.tags}
    for g in gates:
        if g.uses_baseline and not has_baseline:
            raise BadInputError(
                f"gate '{g.expr}' compares with the baseline, but no `baseline` was given",
                hint="Pass `baseline` MODEL, or use an absolute threshold.",
            )
        if g.tag is not None and g.tag not in tags:
            raise BadInputError(
                f"gate '{g.expr}' names tag '{g.tag}', which no example in {prompts} has",
                hint=f"Tags in the file: {', '.join(sorted(tags)) or 'none'}.",
            )
        pool = [ex for ex in examples if g.tag is None or g.tag in ex.tags]
        if not any(applies(g.metric, ex) for ex in pool):
            raise BadInputError(
                f"gate '{g.expr}': no example in {prompts} can be scored on {g.metric} "
                f"({METRICS[g.metric].doc})",
                hint="Add references or checks to the prompt file, or drop the gate.",
            )


def _display_prompt(ex: Example) -> str:
    if ex.messages is not None:
        return "\n".join(f"{m.role}: {m.content}" for m in ex.messages)
    return ex.prompt or ""


def _judge(gate: Gate, result: EvalResult) -> GateResult:
    s = result.summary(gate.metric, gate.tag)
    if s is None or s.candidate is None or (gate.uses_baseline and s.baseline is None):
        return GateResult(gate.expr, False, None, None, None, "no value: the metric could not be computed")
    thr = gate.threshold(s.baseline)
    ok = gate.check(s.candidate, s.baseline)
    return GateResult(gate.expr, ok, s.candidate, thr, s.baseline, f"{s.candidate:.4g} {gate.op} {thr:.4g}")


@dataclass(frozen=True)
class EvalInputs:
    """What an eval consumes: the candidate's ``ModelRef``; ``named``: the candidate as the command line named it (a
    model directory, or the model an endpoint serves; default: the ref's base); ``baseline``: the ``ModelRef`` of the
    directory the options' baseline names, where the caller has it. A ref's content hash is the report's, not
    computed again."""

    candidate: ModelRef
    baseline: ModelRef | None = None
    named: str | None = None


def run(inputs: EvalInputs, options: EvalOptions) -> EvalResult:
    """The eval stage's entry point: ``evaluate`` the candidate; a failed gate is in the result, not raised."""
    named = inputs.named if inputs.named is not None else str(inputs.candidate.base)
    return evaluate(named, options, candidate_ref=inputs.candidate, baseline_ref=inputs.baseline)


def evaluate(candidate: str, options: EvalOptions | None = None, *, candidate_ref: ModelRef | None = None,
             baseline_ref: ModelRef | None = None, **fields: Any) -> EvalResult:
    """Generate with both models, score, compare, judge the gates, and write the reports.

    ``options`` (or ``EvalOptions`` field names as keywords, e.g. ``prompts=...``) say how. ``candidate_ref`` (and
    ``baseline_ref``, the baseline's) carries its hash: the report's, not computed again.
    Raises nothing for a failed gate (see ``EvalResult.passed`` and ``require_pass``);
    every backend failure raises ``ExternalToolError``.
    """
    o = replace(options, **fields) if options is not None else EvalOptions(**fields)
    prompts, baseline, backend, endpoint = o.prompts, o.baseline, o.backend, o.endpoint
    model_name, baseline_endpoint, metrics, gates = o.model_name, o.baseline_endpoint, o.metrics, o.gates
    report_dir, force, max_tokens, resamples, seed = o.report_dir, o.force, o.max_tokens, o.resamples, o.seed
    use_cache, concurrency, max_model_len, api_key = o.use_cache, o.concurrency, o.max_model_len, o.api_key
    t0 = time.monotonic()
    examples = load_prompts(prompts)
    parsed_gates = [parse_gate(g) for g in gates]
    names = parse_metrics(metrics)
    explicit = set(names if metrics else []) | {g.metric for g in parsed_gates}
    names += [g.metric for g in parsed_gates if g.metric not in names]
    _check_gates(parsed_gates, examples, baseline is not None, prompts)
    if o.refusal_patterns is not None:
        from qlift.quality.refusal import patterns

        patterns(o.refusal_patterns)  # a bad file is one line before anything is generated
    if report_dir is not None:
        given = [Path(prompts), *(Path(m) for m in (candidate, baseline) if m and Path(m).exists())]
        check_output_path(Path(report_dir), force=force, inputs=given)
    kind = pick_backend(backend, endpoint)
    engine_args = _engine_args(o.engine_sets, kind)

    if kind == "endpoint":
        assert endpoint is not None
        models = [EvalModel("candidate", model_name or candidate, endpoint=endpoint)]
        if baseline is not None:
            models.append(EvalModel("baseline", baseline, endpoint=baseline_endpoint or endpoint))
    else:
        chat = any(ex.messages is not None for ex in examples)
        models = [_local_model("candidate", candidate, chat=chat, ref=candidate_ref)]
        models[0].engine_args = engine_args
        if baseline is not None:
            models.append(_local_model("baseline", baseline, chat=chat, ref=baseline_ref))

    sampling = Sampling(max_tokens=max_tokens, seed=seed)
    requests = [Request.of(ex) for ex in examples]
    impl = _make_backend(kind, concurrency=concurrency, max_model_len=max_model_len, api_key=api_key)
    cache = GenerationCache(eval_cache_dir() if use_cache else None)
    gens, stats = cached_generate(models, requests, sampling, impl, cache)
    if stats.shared_models:
        log.info("candidate and baseline have the same content: generated once")

    notes: list[str] = []
    scores = {m.role: {n: [score(n, ex, g, refusal_patterns=o.refusal_patterns)
                           for ex, g in zip(examples, gens[m.role], strict=True)] for n in names}
              for m in models}
    if "ppl" in names and any(ex.reference for ex in examples) and all(
        s is None for s in scores["candidate"]["ppl"]
    ):
        if "ppl" in explicit:
            raise ExternalToolError(
                f"the {kind} backend gave no reference log-probabilities, so ppl cannot be computed",
                hint="Use the vllm or transformers backend, or a vLLM server (it has /tokenize).", tool=kind,
            )
        names.remove("ppl")
        notes.append(f"ppl left out: the {kind} backend gave no reference log-probabilities")

    def slice_summaries(keep: list[int]) -> list[MetricSummary]:
        out = []
        for n in names:
            cand = [scores["candidate"][n][i] for i in keep]
            base = [scores["baseline"][n][i] for i in keep] if baseline is not None else None
            out.append(summarize(n, cand, base, resamples=resamples, seed=seed))
        return out

    overall = slice_summaries(list(range(len(examples))))
    tags = sorted({t for ex in examples for t in ex.tags})
    slices = {t: slice_summaries([i for i, ex in enumerate(examples) if t in ex.tags]) for t in tags}
    rows = [
        ExampleRow(
            id=ex.id, tags=ex.tags, prompt=_display_prompt(ex), reference=ex.reference,
            outputs={m.role: gens[m.role][i].text for m in models},
            scores={n: {m.role: _value(scores[m.role][n][i]) for m in models} for n in names},
        )
        for i, ex in enumerate(examples)
    ]
    result = EvalResult(
        candidate=models[0], baseline=models[1] if len(models) > 1 else None, prompts=str(prompts),
        examples_count=len(examples), backend=kind, sampling=sampling, metrics=names, overall=overall,
        slices=slices, gates=[], passed=True, examples=rows, cache=stats,
        bootstrap={"resamples": resamples, "seed": seed}, notes=notes,
        answers={m.role: impl.answers_by(m) for m in models},
    )
    if "latency" in names and len(models) > 1:
        result.latency_warning = latency_warning(models[0], models[1], stats.load)
        if result.latency_warning:
            notes.append(result.latency_warning)
    if o.judge is not None:
        result.judge = _judge_model(o, examples, rows)
    if o.score_with_baseline:
        from qlift.eval.baseline_reads import baseline_reads

        result.baseline_reads = baseline_reads(models[1], requests, gens, impl, cache, resamples=resamples, seed=seed)
    result.gates = [_judge(g, result) for g in parsed_gates]
    result.passed = all(g.passed for g in result.gates)
    result.seconds = round(time.monotonic() - t0, 3)
    if report_dir is not None:
        from qlift.eval.report import write_reports

        write_reports(result, Path(report_dir), force=force, inputs=_inputs(models, prompts))
        result.report_dir = str(report_dir)
        from qlift.gates.index import record_of, write_record

        record = record_of(result, Path(report_dir))
        if record is not None:  # what `qlift serve --recipe auto` reads (qlift.gates.index)
            log.info("gate record for %s: %s", record["content_hash"], write_record(record))
    return result


def _engine_args(sets: tuple[str, ...], kind: str) -> dict[str, Any]:
    """``--set`` items as vLLM engine arguments for the candidate; only the vllm backend runs them."""
    if not sets:
        return {}
    if kind != "vllm":
        raise BadInputError(f"`engine_sets` configures the vllm backend, but this eval uses the {kind} backend",
                            field="engine_sets", hint="Pass `backend` vllm, or serve the candidate with the "
                                                      "setting and evaluate that endpoint.")
    from qlift.serve.recipes import engine_spec, parse_sets

    return engine_spec(parse_sets(sets)).args()


def _judge_model(o: EvalOptions, examples: list[Example], rows: list[ExampleRow]) -> dict[str, Any]:
    """The judge model's verdicts, candidate against baseline, on an even sample of the prompts."""
    from qlift.quality.judge import JudgeSettings, judge_pairs, parse_target, read_rubric
    from qlift.quality.registry import user_text

    assert o.judge is not None
    url, model = parse_target(o.judge)
    rubric, name = read_rubric(o.judge_rubric)
    settings = JudgeSettings(url, model, rubric, name, pairs=o.judge_pairs, concurrency=max(1, o.concurrency),
                             deadline_s=max(60.0, 2.0 * o.judge_pairs))
    triples = [(user_text(ex.prompt_key()), row.outputs["baseline"], row.outputs["candidate"])
               for ex, row in zip(examples, rows, strict=True)]
    return judge_pairs(triples, settings).summary()


UNEQUAL_LOAD = 1.0  # load-average difference (runnable processes) from which timings are not comparable


def latency_warning(candidate: EvalModel, baseline: EvalModel, load: dict[str, float]) -> str | None:
    """Why candidate and baseline latencies are not a like-for-like comparison, if they are not."""
    if candidate.endpoint and (candidate.endpoint, candidate.name) != (baseline.endpoint, baseline.name):
        return (f"latency was timed on two servers ({candidate.name} at {candidate.endpoint}, {baseline.name} at "
                f"{baseline.endpoint}), whose cores may be unequally loaded: the difference need not be the "
                "models'; compare them on equal, otherwise idle cores (or with `qlift bench` on each)")
    c, b = load.get("candidate"), load.get("baseline")
    if c is not None and b is not None and abs(c - b) >= UNEQUAL_LOAD:
        return (f"latency was timed under unequal load (load average {c:.1f} for the candidate, {b:.1f} for the "
                "baseline): the difference need not be the models'; rerun with --no-cache on a quieter machine")
    return None


def _value(s: Any) -> float | None:
    return None if s is None else float(s.value)


def _inputs(models: list[EvalModel], prompts: Path) -> dict[str, Path]:
    inputs = {m.role: m.path for m in models if m.path is not None}
    return {**inputs, "prompts": Path(prompts)}


def require_pass(result: EvalResult) -> None:
    """Raise ``GateFailedError`` naming every gate that failed."""
    failed = [g for g in result.gates if not g.passed]
    if failed:
        what = "; ".join(f"{g.expr} ({g.detail})" for g in failed)
        where = f" See {result.report_dir}/report.md." if result.report_dir else ""
        raise GateFailedError(
            f"{len(failed)} of {len(result.gates)} gate(s) failed: {what}",
            hint=f"The candidate is not ready to promote.{where}",
        )


__all__ = ["EvalInputs", "EvalResult", "ExampleRow", "Generation", "evaluate", "require_pass", "run"]
