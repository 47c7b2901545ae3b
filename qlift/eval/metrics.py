"""Per-example metrics, and how each one aggregates and compares.

Every metric is a per-example value, or None where it does not apply (no reference, no
check of that kind). Perplexity is token-level: the aggregate is exp(total NLL / total
reference tokens), not a mean of per-example perplexities.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError
from qlift.eval.generation import Generation
from qlift.eval.prompts import Example
from qlift.quality.registry import ANSWER_METRICS, Answer
from qlift.quality.registry import BY_NAME as QUALITY
from qlift.quality.repetition import repeated_share
from qlift.quality.schema import matches_schema, parse_json_output  # noqa: F401  (parse_json_output: re-exported)
from qlift.quality.text import rouge_l


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool | None  # None: neither (output length)
    applies: str  # which examples: all | reference | json | schema | checks
    doc: str


# The answer metrics of qlift.quality (also the rollout judge's answer checks): a share of bad answers.
_ANSWER_METRICS = tuple(Metric(m.name, False, "all", f"Share of {m.what}: {m.doc}") for m in ANSWER_METRICS
                        if m.offline)
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("ppl", False, "reference", "Perplexity of the reference given the prompt (token-level)."),
    Metric("exact_match", True, "reference", "Output equals the reference (surrounding whitespace ignored, "
           "Unicode NFC)."),
    Metric("rougeL", True, "reference", "ROUGE-L F1 against the reference, 0-1, over words and CJK characters "
           "(rouge-score's figures on ASCII text; see docs/eval.md)."),
    Metric("chrF", True, "reference", "chrF against the reference (sacrebleu), 0-100."),
    Metric("json_valid", True, "json", "Output parses as JSON (a ```json fence is allowed), 0-1."),
    Metric("schema_pass", True, "schema", "Output validates against the example's json_schema, 0-1."),
    Metric("check_pass", True, "checks", "Every check of the example passes, 0-1."),
    Metric("length", None, "all", "Output length in tokens."),
    Metric("latency", False, "all", "Seconds from request to last token (batched for vLLM offline)."),
    Metric("repetition", False, "all", "Share of the output's word 4-grams seen earlier in it (0-1; none under "
           "8 words)."),
    *_ANSWER_METRICS,
)}
DEFAULT_METRICS = tuple(METRICS)


def parse_metrics(spec: str | None) -> list[str]:
    if not spec:
        return list(DEFAULT_METRICS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for n in names:
        if n not in METRICS:
            raise BadInputError(
                f"unknown metric '{n}'", hint=f"Choose from: {', '.join(METRICS)}.", field="metrics"
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


def _schema_ok(schema: dict[str, Any], text: str) -> bool:
    return matches_schema(schema, text)


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
        if not all(_nfc(n) in _nfc(text) for n in needles):
            return False
    return not (c.max_chars is not None and len(text) > c.max_chars)


def _nfc(text: str) -> str:
    """One spelling of each character: an accented letter typed as letter + combining accent (NFD, as
    macOS file names and some tokenizers produce) equals its precomposed form."""
    return text if text.isascii() else unicodedata.normalize("NFC", text)


@dataclass
class Score:
    """A per-example value; for ppl, ``num`` / ``den`` are the NLL sum and token count."""

    value: float
    num: float
    den: float


def score(metric: str, ex: Example, gen: Generation, *, refusal_patterns: Path | None = None) -> Score | None:
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
        v = float(_nfc(text).strip() == _nfc(ref).strip())
    elif metric == "rougeL":
        v = rouge_l(ref, text)
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
    elif metric == "repetition":
        share = repeated_share(text)
        if share is None:
            return None
        v = share
    elif metric in QUALITY:
        flag = QUALITY[metric].flag(Answer(ex.prompt_key(), text, refusal_patterns=refusal_patterns,
                                           finish_reason=gen.finish_reason,
                                           tool_calls=tuple((n, a) for n, a in gen.tool_calls)))
        if flag is None:
            return None
        v = float(flag)
    else:  # pragma: no cover - parse_metrics rejects unknown names
        raise KeyError(metric)
    return Score(v, v, 1.0)
