"""The answer metrics: one entry each, read by ``qlift eval`` and by the rollout judge.

An entry flags one answer to one request as bad (True), good (False) or not applicable (None):
a looping answer, one that restates itself, one in another language than the prompt (or switching
to another mid-answer), a refusal, one cut mid-sentence, one cut by the content filter, an answer
that breaks the JSON schema its own request sent or is no JSON where JSON was asked, one that leaks
its system prompt. Offline, ``qlift eval`` reports each as a share of examples;
live, the judge compares the canary's share with the stable's (``rollout.checks``: a share ratio
over ``limit``, then a one-sided proportion test in the window's Bonferroni family).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from qlift.quality.language import off_language
from qlift.quality.leak import leaks
from qlift.quality.refusal import refuses
from qlift.quality.repetition import loop_length, loops, tokens
from qlift.quality.rephrase import near_repetition
from qlift.quality.schema import asks_json, json_invalid, matches_schema, request_schema
from qlift.quality.unfinished import unfinished

PROMPT_CHARS = 2000  # the opening of the prompt that is judged (its language)


@dataclass(frozen=True)
class Answer:
    """What a metric reads: the request (``messages`` or ``prompt``, a system prompt, ``response_format``)
    and the answer; ``other`` is the other version's answer to the same request where there is one (shadow
    pairs); ``finish_reason`` the server's (``stop``, ``length``, ``content_filter``), where it is known."""

    request: dict[str, Any]
    text: str
    other: str | None = None
    refusal_patterns: Path | None = None
    finish_reason: str | None = None

    @property
    def prompt(self) -> str:
        return user_text(self.request)[:PROMPT_CHARS]

    @property
    def system(self) -> str:
        return system_text(self.request)


def message_text(content: Any) -> str:
    """A chat message's content as text: a string, or its parts' texts, one a line."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str))
    return ""


def user_text(request: dict[str, Any]) -> str:
    """The text the user wrote: the last user message (its text parts), else the raw prompt."""
    for m in reversed(request.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str | list):
            return message_text(m["content"])
    prompt = request.get("prompt")
    return prompt if isinstance(prompt, str) else ""


def system_text(request: dict[str, Any]) -> str:
    """The system prompt: the system-role messages (shadow pairs keep messages), else the ``system`` key
    (the router's split-window request log: ``{"prompt": ..., "system": ..., "response_format": ...}``)."""
    parts = [message_text(m.get("content")) for m in request.get("messages") or []
             if isinstance(m, dict) and m.get("role") in ("system", "developer")]
    if parts:
        return "\n".join(parts)
    system = request.get("system")
    return system if isinstance(system, str) else ""


def _schema_broken(a: Answer) -> bool | None:
    schema = request_schema(a.request)
    return None if schema is None else not matches_schema(schema, a.text)


def _json_invalid(a: Answer) -> bool | None:
    return json_invalid(asks_json(a.request, a.system, user_text(a.request)), a.text)


def _content_filtered(a: Answer) -> bool | None:
    return None if a.finish_reason is None else a.finish_reason == "content_filter"


@dataclass(frozen=True)
class AnswerMetric:
    name: str  # the flag's name: evidence counts, the check and the eval metric carry it
    what: str  # the bad answers, in words ("answers that loop")
    flag: Callable[[Answer], bool | None]
    limit: str  # the AnalysisSpec field: highest canary/stable share ratio that passes
    offline: bool  # `qlift eval --metrics` has it (the request schema is a live-only notion)
    applies: str  # to which answers, in words
    doc: str


ANSWER_METRICS: tuple[AnswerMetric, ...] = (
    AnswerMetric("loops", "answers that loop", lambda a: loops(a.text), "max_loop_share_ratio", True, "every answer",
                 "The answer ends in a unit of 1-64 words (or CJK characters) repeated 3+ times over 12+ of them."),
    AnswerMetric("off_language", "answers in another language than the prompt",
                 lambda a: off_language(a.prompt, a.text), "max_off_language_share_ratio", True,
                 "answers and user messages of 4+ words",
                 "The answer is (30%+ of its words) in another script than the user's message, or py3langid "
                 "names another language; JSON structure, code and URLs are not language. Not applicable "
                 "under 4 words on either side."),
    AnswerMetric("refusal", "refusals", lambda a: refuses(a.text, a.refusal_patterns), "max_refusal_share_ratio",
                 True, "every answer", "A refusal pattern (English and Chinese, qlift/quality/data/refusals.txt; "
                 "more from --refusal-patterns) matches at a clause start of the answer's first 300 characters: "
                 "its start, after a sentence end (\"Thanks for reaching out! Unfortunately I can't help\"), or "
                 "after a comma and a contrast word (\", but I can't help\")."),
    AnswerMetric("schema_broken", "answers that break their request's JSON schema", _schema_broken,
                 "max_schema_broken_share_ratio", False, "requests with response_format json_schema",
                 "The request sent response_format json_schema and the answer does not validate against it."),
    AnswerMetric("json_invalid", "answers that are no JSON where JSON was asked", _json_invalid,
                 "max_json_invalid_share_ratio", True,
                 "requests that ask for JSON: response_format json_object/json_schema, the word JSON in the system "
                 "prompt, or a user message asking for JSON output",
                 "JSON was asked for (response_format json_object or json_schema, the word JSON in the system "
                 "prompt, or the user asking for JSON output: \"answer in JSON\", \"return only JSON\", "
                 "\"以JSON格式\") and the answer does not parse (one markdown fence tolerated)."),
    AnswerMetric("unfinished", "answers cut mid-sentence", lambda a: unfinished(a.text, a.finish_reason),
                 "max_unfinished_share_ratio", True, "non-empty answers with a finish reason other than length "
                 "and content_filter",
                 "The server finished the answer (finish_reason stop) but its prose ends without a sentence end; "
                 "a list item, table row, heading, code block, JSON, URL, emoji or sign-off line is an ending. "
                 "A one-line answer under 8 words is terse, not cut. Not applicable without a finish reason."),
    AnswerMetric("near_repetition", "answers that restate themselves", lambda a: near_repetition(a.text),
                 "max_near_repetition_share_ratio", True, "answers with a sentence of 3+ content words",
                 "3+ sentences, a quarter or more of those judged, restate the 4 before them: half or more of "
                 "their content words (CJK: character pairs) are in those sentences, without any exact repeat. "
                 "Code, tables and URLs are not judged."),
    AnswerMetric("leak", "answers that leak their system prompt", lambda a: leaks(a.system, a.text),
                 "max_leak_share_ratio", True, "requests with a system prompt of 8+ words (16+ CJK characters)",
                 "The answer holds a verbatim run of 12+ tokens of its system prompt (24+ for a mostly-CJK one), "
                 "or of 80% of a shorter one."),
    AnswerMetric("content_filtered", "answers cut by the content filter", _content_filtered,
                 "max_content_filtered_share_ratio", True, "answers with a finish reason",
                 "The router's content filter cut the answer (finish_reason content_filter)."),
)
BY_NAME = {m.name: m for m in ANSWER_METRICS}


def answer_flags(answer: Answer, refusal_patterns: Path | None = None) -> dict[str, bool]:
    """Every applicable metric's flag for one answer (memoised: a held window judges its answers again).
    The key is all a flag reads: the user's and the system's text, the answer, its finish reason, the
    response format and the refusal patterns."""
    fmt = answer.request.get("response_format")
    return dict(_flags(user_text(answer.request), answer.system, answer.text,
                       json.dumps(fmt, sort_keys=True) if fmt else "", answer.finish_reason,
                       refusal_patterns or answer.refusal_patterns))


@lru_cache(maxsize=16384)
def _flags(user: str, system: str, text: str, fmt: str, finish_reason: str | None, patterns: Path | None
           ) -> tuple[tuple[str, bool], ...]:
    request: dict[str, Any] = {"prompt": user, "system": system}
    if fmt:
        request["response_format"] = json.loads(fmt)
    one = Answer(request, text, refusal_patterns=patterns, finish_reason=finish_reason)
    return tuple((m.name, v) for m in ANSWER_METRICS if (v := m.flag(one)) is not None)


def count(answers: list[Answer], name: str, refusal_patterns: Path | None = None) -> tuple[int, int]:
    """(flagged, judged) answers for metric ``name``."""
    hits = judged = 0
    for a in answers:
        v = answer_flags(a, refusal_patterns).get(name)
        if v is not None:
            judged += 1
            hits += v
    return hits, judged


# Shown to a person in `promote status`: never a key or a token that a prompt or answer carried.
_SECRET = re.compile(
    r"\b(sk|pk|rk|ghp|gho|ghs|xox[abp]|hf|AKIA)[-_][A-Za-z0-9_\-]{8,}"  # provider key prefixes
    r"|\b(bearer|token|api[_-]?key|password|passwd|secret)\b(\s*[:=]\s*|\s+)\S+"  # key: value
    r"|\b[A-Za-z0-9+/_\-]{32,}={0,2}"  # long opaque strings
    r"|://[^/\s:@]+:[^/\s@]+@", re.IGNORECASE)
EXAMPLE_CHARS = {"prompt": 160, "answer": 240}


def redact_secrets(text: str) -> str:
    return _SECRET.sub("[redacted]", text)


def _head(text: str | None, n: int) -> str | None:
    if text is None:
        return None
    text = redact_secrets(" ".join(text.split()))
    return text if len(text) <= n else text[:n - 1] + "…"


def examples(answers: list[Answer], name: str, refusal_patterns: Path | None = None, k: int = 3
             ) -> list[dict[str, str | None]]:
    """Up to ``k`` flagged answers for a person to read (``answer``: this version's; ``other``: the other
    version's answer to the same prompt, where known); loops longest first, else in arrival order."""
    flagged = [a for a in answers if answer_flags(a, refusal_patterns).get(name)]
    if name == "loops":
        flagged.sort(key=lambda a: -loop_length(tokens(a.text)))
    return [{"prompt": _head(a.prompt, EXAMPLE_CHARS["prompt"]), "answer": _head(a.text, EXAMPLE_CHARS["answer"]),
             "other": _head(a.other, EXAMPLE_CHARS["answer"])} for a in flagged[:k]]
