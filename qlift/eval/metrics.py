"""Per-example metrics, and how each one aggregates and compares.

Every metric is a per-example value, or None where it does not apply (no reference, no
check of that kind). Perplexity is token-level: the aggregate is exp(total NLL / total
reference tokens), not a mean of per-example perplexities.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from qlift.errors import BadInputError
from qlift.eval.generation import Generation
from qlift.eval.prompts import Example


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool | None  # None: neither (output length)
    applies: str  # which examples: all | reference | json | schema | checks
    doc: str


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("ppl", False, "reference", "Perplexity of the reference given the prompt (token-level)."),
    Metric("exact_match", True, "reference", "Output equals the reference (surrounding whitespace ignored)."),
    Metric("rougeL", True, "reference", "ROUGE-L F1 against the reference (rouge-score), 0-1."),
    Metric("chrF", True, "reference", "chrF against the reference (sacrebleu), 0-100."),
    Metric("json_valid", True, "json", "Output parses as JSON (a ```json fence is allowed), 0-1."),
    Metric("schema_pass", True, "schema", "Output validates against the example's json_schema, 0-1."),
    Metric("check_pass", True, "checks", "Every check of the example passes, 0-1."),
    Metric("length", None, "all", "Output length in tokens."),
    Metric("latency", False, "all", "Seconds from request to last token (batched for vLLM offline)."),
)}
DEFAULT_METRICS = tuple(METRICS)


def parse_metrics(spec: str | None) -> list[str]:
    if not spec:
        return list(DEFAULT_METRICS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for n in names:
        if n not in METRICS:
            raise BadInputError(
                f"unknown metric '{n}'", hint=f"Choose from: {', '.join(METRICS)}.", field="--metrics"
            )
    return names


def applies(metric: str, ex: Example) -> bool:
    kind = METRICS[metric].applies
    if kind == "all":
        return True
    if kind == "reference":
        return ex.reference is not None
    checks = ex.checks
    if checks is None:
        return False
    if kind == "json":
        return checks.wants_json
    if kind == "schema":
        return checks.json_schema is not None
    return not checks.is_empty()


_FENCE = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?```\s*$", re.DOTALL)


def parse_json_output(text: str) -> tuple[bool, Any]:
    """(parsed?, value); one surrounding markdown code fence is tolerated."""
    m = _FENCE.match(text)
    body = m.group(1) if m else text
    try:
        return True, json.loads(body)
    except ValueError:
        return False, None


@lru_cache(maxsize=1)
def _rouge() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def _schema_ok(schema: dict[str, Any], text: str) -> bool:
    import jsonschema

    ok, value = parse_json_output(text)
    if not ok:
        return False
    return jsonschema.validators.validator_for(schema)(schema).is_valid(value)


def _checks_ok(ex: Example, text: str) -> bool:
    c = ex.checks
    assert c is not None
    if c.json_schema is not None and not _schema_ok(c.json_schema, text):
        return False
    if c.json_ and not parse_json_output(text)[0]:
        return False
    if c.regex is not None and not re.search(c.regex, text):
        return False
    if c.contains is not None:
        needles = [c.contains] if isinstance(c.contains, str) else c.contains
        if not all(n in text for n in needles):
            return False
    return not (c.max_chars is not None and len(text) > c.max_chars)


@dataclass
class Score:
    """A per-example value; for ppl, ``num`` / ``den`` are the NLL sum and token count."""

    value: float
    num: float
    den: float


def score(metric: str, ex: Example, gen: Generation) -> Score | None:
    """The example's value of ``metric``, or None when it does not apply or is unavailable."""
    if not applies(metric, ex):
        return None
    text = gen.text
    ref = ex.reference or ""
    if metric == "ppl":
        if gen.ref_logprob is None or not gen.ref_tokens:
            return None
        nll = -gen.ref_logprob
        return Score(math.exp(nll / gen.ref_tokens), nll, float(gen.ref_tokens))
    v: float
    if metric == "exact_match":
        v = float(text.strip() == ref.strip())
    elif metric == "rougeL":
        v = float(_rouge().score(ref, text)["rougeL"].fmeasure)
    elif metric == "chrF":
        import sacrebleu

        v = float(sacrebleu.sentence_chrf(text, [ref]).score)
    elif metric == "json_valid":
        v = float(parse_json_output(text)[0])
    elif metric == "schema_pass":
        assert ex.checks is not None and ex.checks.json_schema is not None
        v = float(_schema_ok(ex.checks.json_schema, text))
    elif metric == "check_pass":
        v = float(_checks_ok(ex, text))
    elif metric == "length":
        v = float(gen.output_tokens)
    elif metric == "latency":
        v = float(gen.latency_s)
    else:  # pragma: no cover - parse_metrics rejects unknown names
        raise KeyError(metric)
    return Score(v, v, 1.0)
