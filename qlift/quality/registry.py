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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar, overload

from qlift.quality.engagement import disengaged
from qlift.quality.language import off_language
from qlift.quality.leak import leaks
from qlift.quality.limits import SHARE_LIMITS
from qlift.quality.refusal import refuses
from qlift.quality.repetition import loop_length, loops, tokens
from qlift.quality.rephrase import near_repetition
from qlift.quality.schema import asks_json, json_invalid, matches_schema, request_schema
from qlift.quality.textshape import text_shape
from qlift.quality.toolcalls import ToolCall, tool_call_broken
from qlift.quality.unfinished import unfinished

PROMPT_CHARS = 2000  # the opening of the prompt that is judged (its language)


@dataclass(frozen=True, slots=True)  # slots: the judge builds a window's answers again for each metric
class Answer:
    """What a metric reads: the request (``messages`` or ``prompt``, a system prompt, ``response_format``,
    ``tools`` and ``tool_choice``) and the answer; ``other`` is the other version's answer to the same request
    where there is one (shadow pairs); ``finish_reason`` the server's (``stop``, ``length``, ``content_filter``),
    where it is known; ``tool_calls`` the answer's calls, (name, arguments) each (``qlift.quality.toolcalls``);
    ``completion_tokens`` the server's count, where it is known (the rollout compares lengths by request shape)."""

    request: dict[str, Any]
    text: str
    other: str | None = None
    refusal_patterns: Path | None = None
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    completion_tokens: int | None = None

    @property
    def prompt(self) -> str:
        return user_text(self.request)[:PROMPT_CHARS]

    @property
    def system(self) -> str:
        return system_text(self.request)


RequestParts = tuple[str, str, str, str]  # the user's text, the system's, the response format and the tools as JSON
_canonical = json.JSONEncoder(sort_keys=True).encode  # json.dumps(..., sort_keys=True) without a new encoder a call
_READ = ("messages", "prompt", "system", "response_format", "tools", "tool_choice")  # what request_parts reads


def _request_parts(request: dict[str, Any]) -> RequestParts:
    fmt = request.get("response_format")
    tools = {k: request[k] for k in ("tools", "tool_choice") if request.get(k) is not None}
    return (user_text(request), system_text(request), _canonical(fmt) if fmt else "",
            _canonical(tools) if tools else "")


class _ByRequest:
    """``RequestParts`` remembered by request object: the judge builds a window's answers again for each metric,
    around the same request dicts (24 looks a pair), and the format's JSON is most of a look's cost. A request is
    not changed once judged (the router's records are read-only): one whose top-level values were replaced by
    others, or whose messages grew, is read again; an entry holds its request, so no other object takes its id."""

    def __init__(self, size: int = 8192) -> None:
        self._size = size
        self._memo: dict[int, tuple[dict[str, Any], tuple[Any, ...], int, RequestParts]] = {}

    def __call__(self, request: dict[str, Any]) -> RequestParts:
        values = tuple(map(request.get, _READ))
        n = len(values[0]) if isinstance(values[0], list) else -1  # the messages
        hit = self._memo.get(id(request))
        if hit is not None and hit[0] is request and hit[2] == n and hit[1] == values:
            return hit[3]
        parts = _request_parts(request)
        if len(self._memo) >= self._size:
            self._memo.clear()
        self._memo[id(request)] = (request, values, n, parts)
        return parts

    def cache_clear(self) -> None:
        self._memo.clear()


request_parts = _ByRequest()


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
    offline: bool  # `qlift eval --metrics` has it (the request schema is a live-only notion)
    applies: str  # to which answers, in words
    doc: str
    evidence: Callable[[Answer], str | None] | None = None  # what a person reads beside a flagged answer

    @property
    def limit(self) -> str:
        """The AnalysisSpec field: highest canary/stable share ratio that passes (``limits.SHARE_LIMITS``)."""
        return SHARE_LIMITS[self.name].field


ANSWER_METRICS: tuple[AnswerMetric, ...] = (
    AnswerMetric("loops", "answers that loop", lambda a: loops(a.text), True, "every answer",
                 "The answer ends in a unit of 1-64 words (or CJK characters) repeated 3+ times over 12+ of them."),
    AnswerMetric("off_language", "answers in another language than the prompt",
                 lambda a: off_language(a.prompt, a.text), True, "answers and user messages of 4+ words",
                 "The answer is (30%+ of its words) in another script than the user's message, switches to one "
                 "for a clause, or py3langid names another language; JSON structure, code, URLs, formulas, names "
                 "and terms, and quoted text (block quotes, quotes of any script, runs copied from the user's "
                 "message) are not language. Not applicable under 4 words on either side."),
    AnswerMetric("refusal", "refusals", lambda a: refuses(a.text, a.refusal_patterns, a.prompt), True,
                 "every answer", "A refusal pattern matches at a clause start of the answer's first 300 "
                 "characters: its start, after a sentence end of any script (. ! ? 。 ؟ ।), after a greeting "
                 "(\"Hola, no puedo\"), or after a comma and a contrast or an apology (\", but I can't help\", "
                 "\"，但是我无法\"). Patterns ship for zh, en, es, pt, fr, de, ru, ja, ko, ar, hi, vi, id, tr, it, nl, "
                 "pl and uk, one file a language in qlift/quality/data/refusals/; more from --refusal-patterns "
                 "(analysis.refusal_patterns), a file of the same format. Case, accents, harakat and curly or "
                 "full-width punctuation do not matter; a quoted refusal, a polite opening (\"Lo siento por la "
                 "espera\") and a program's \"cannot\" are no refusal. In English also \"I can't\", \"I'm unable to\", "
                 "\"I lack the ability to\" ... followed by a verb that opens one of the request's sentences (\"Count "
                 "to ten.\" -> \"I'm not able to count to ten\"), where no pattern lists that verb."),
    AnswerMetric("schema_broken", "answers that break their request's JSON schema", _schema_broken,
                 False, "requests with response_format json_schema",
                 "The request sent response_format json_schema and the answer does not validate against it."),
    AnswerMetric("json_invalid", "answers that are no JSON where JSON was asked", _json_invalid, True,
                 "requests that ask for JSON: response_format json_object/json_schema, the word JSON in the system "
                 "prompt, or a user message asking for JSON output",
                 "JSON was asked for (response_format json_object or json_schema, the word JSON in the system "
                 "prompt, or the user asking for JSON output: \"answer in JSON\", \"return only JSON\", "
                 "\"以JSON格式\") and the answer does not parse (one markdown fence tolerated)."),
    AnswerMetric("unfinished", "answers cut mid-sentence", lambda a: unfinished(a.text, a.finish_reason),
                 True, "non-empty answers with a finish reason other than length and content_filter",
                 "The server finished the answer (finish_reason stop) but its prose ends without a sentence end; "
                 "a closing bracket or quote and a sentence end of any script, a list item, table row, heading, "
                 "code block, JSON, URL, emoji, kaomoji, poem or sign-off line is an ending. "
                 "A one-line answer under 8 words is terse, not cut. Not applicable without a finish reason."),
    AnswerMetric("near_repetition", "answers that restate themselves", lambda a: near_repetition(a.text),
                 True, "answers with a sentence of 3+ content words",
                 "3+ sentences, a quarter or more of those judged, restate the 4 before them: half or more of "
                 "their content words (CJK: character pairs) are in those sentences, without any exact repeat. "
                 "Code, tables, list items, JSON and URLs are not judged."),
    AnswerMetric("leak", "answers that leak their system prompt", lambda a: leaks(a.system, a.text),
                 True, "requests with a system prompt of 8+ words (16+ CJK characters)",
                 "The answer holds a verbatim run of 12+ tokens of its system prompt (24+ for a mostly-CJK one), "
                 "or of 80% of a shorter one."),
    AnswerMetric("content_filtered", "answers cut by the content filter", _content_filtered,
                 True, "answers with a finish reason",
                 "The router's content filter cut the answer (finish_reason content_filter)."),
    AnswerMetric("tool_call_broken", "broken tool calls", lambda a: tool_call_broken(a.request, a.tool_calls, a.text),
                 True, "requests that offered tools",
                 "A call's function.arguments do not parse as a JSON object or do not validate against the offered "
                 "tool's parameters schema, a call names a tool that was not offered, no call came where "
                 "tool_choice was \"required\" or named a function, or (no calls) the answer's text holds a "
                 "Hermes-style <tool_call> block whose JSON is broken. Not applicable without tools, or with "
                 "tool_choice \"none\"."),
    AnswerMetric("disengaged", "answers that take up nothing the request asked",
                 lambda a: disengaged(a.prompt, a.text, a.other), True,
                 "requests with 2+ content units weighing 10+ (about three short words or two long ones; CJK: "
                 "character pairs), answers in the request's language that are not data or verse",
                 "The answer (10+ words) takes up under 10% of the request's content words: function words of 15 "
                 "languages and the words of asking, small talk and form left out, stems of 5 letters, CJK as "
                 "character pairs, long words weighing more. Where the other version's answer is known (shadow "
                 "pairs) it is the standard: flagged when that one takes the request up and this one shares little "
                 "of it (\"Paris.\" beside \"The capital of France is Paris.\" shares it). Not applicable to requests "
                 "of under 2 content units weighing 10, to answers that are data or verse (code, JSON, tables, a "
                 "tree, a formula, a poem) and take up nothing, nor, alone, to answers in another language than the "
                 "request."),
    AnswerMetric("text_shape", "answers with garbled, padded, repeated or template text",
                 lambda a: text_shape(a.text) is not None if a.text.strip() else None,
                 True, "every non-empty answer",
                 "The answer's text is broken in shape (qlift/quality/textshape.py): mojibake (UTF-8 read as "
                 "cp1252, latin-1, cp1251, GBK, Shift-JIS ...; rare Han characters), U+FFFD, control, private-use or "
                 "unassigned code points, text escaped twice (&quot;, \\u00e9); padding (blank-line, punctuation, "
                 "emoji or zero-width runs, or mostly no letters); a verbatim passage of 20+ tokens or a prose "
                 "sentence of 10+ seen twice anywhere; or chat-template and reasoning markers (<|im_start|>, [INST], "
                 "USER:, <think> ...) outside code. Each flagged answer carries its evidence (\"mojibake (cp1252): "
                 "'Ã©' x4 (was 'é')\").",
                 evidence=lambda a: text_shape(a.text)),
)
BY_NAME = {m.name: m for m in ANSWER_METRICS}


def answer_flags(answer: Answer, refusal_patterns: Path | None = None) -> Flags:
    """Every applicable metric's flag for one answer (memoised: a held window judges its answers again).
    The key is all a flag reads: the user's and the system's text, the answer, its finish reason, the
    response format, the tools offered and tool_choice, the answer's tool calls, the other version's answer and
    the refusal patterns."""
    calls = tuple((name, args) for name, args in answer.tool_calls) if answer.tool_calls else ()  # JSON lists
    return _flags(refusal_patterns or answer.refusal_patterns, request_parts(answer.request), answer.text,
                  answer.finish_reason, calls, answer.other)


_Default = TypeVar("_Default")


class Flags(Mapping[str, bool]):
    """One answer's flags, read-only: the applicable metrics (a flag that is None is no key), each computed the
    first time it is read. The judge reads one metric over a window's answers, then the next: one check's code
    and tables at a time stay in the CPU's caches (all of an answer's checks in a row cost ~15% more)."""

    def __init__(self, answer: Answer) -> None:
        self._answer: Answer | None = answer
        self._known: dict[str, bool | None] = {}

    def _flag(self, name: str) -> bool | None:
        if name not in self._known:
            if (metric := BY_NAME.get(name)) is None or self._answer is None:
                return None
            self._known[name] = metric.flag(self._answer)
            if len(self._known) == len(ANSWER_METRICS):
                self._answer = None  # every flag is known: the request and texts can go
        return self._known[name]

    def __getitem__(self, name: str) -> bool:
        if (flag := self._flag(name)) is None:
            raise KeyError(name)
        return flag

    @overload
    def get(self, name: str, /) -> bool | None: ...
    @overload
    def get(self, name: str, /, default: bool | _Default) -> bool | _Default: ...

    def get(self, name: str, /, default: object = None) -> object:  # the judge's one read: no KeyError raised
        flag = self._flag(name)
        return default if flag is None else flag

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._flag(name) is not None

    def __iter__(self) -> Iterator[str]:
        return (m.name for m in ANSWER_METRICS if self._flag(m.name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self))


@lru_cache(maxsize=16384)
def _flags(patterns: Path | None, parts: RequestParts, text: str, finish_reason: str | None,
           tool_calls: tuple[ToolCall, ...], other: str | None) -> Flags:
    user, system, fmt, tools = parts
    request: dict[str, Any] = {"prompt": user, "system": system}
    if fmt:
        request["response_format"] = json.loads(fmt)
    if tools:
        request |= json.loads(tools)
    return Flags(Answer(request, text, other, patterns, finish_reason=finish_reason, tool_calls=tool_calls))


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


def example_text(text: str | None, n: int) -> str | None:
    """``text`` as an example shows it: on one line, secrets redacted, cut to ``n`` characters."""
    if text is None:
        return None
    text = redact_secrets(" ".join(text.split()))
    return text if len(text) <= n else text[:n - 1] + "…"


def examples(answers: list[Answer], name: str, refusal_patterns: Path | None = None, k: int = 3
             ) -> list[dict[str, str | None]]:
    """Up to ``k`` flagged answers for a person to read (``answer``: this version's; ``other``: the other
    version's answer to the same prompt, where known; ``evidence``: what is wrong with it, where the metric
    says); loops longest first, else in arrival order."""
    found = (a for a in answers if answer_flags(a, refusal_patterns).get(name))
    # loops: the longest of all; else the first k (the rest of the window is not looked at)
    flagged = sorted(found, key=lambda a: -loop_length(tokens(a.text))) if name == "loops" else list(islice(found, k))
    shown = [{"prompt": example_text(a.prompt, EXAMPLE_CHARS["prompt"]),
              "answer": example_text(_shown(a), EXAMPLE_CHARS["answer"]),
              "other": example_text(a.other, EXAMPLE_CHARS["answer"])} for a in flagged[:k]]
    if (metric := BY_NAME.get(name)) is not None and (evidence := metric.evidence) is not None:
        for example, a in zip(shown, flagged, strict=False):
            example["evidence"] = example_text(evidence(a), EXAMPLE_CHARS["answer"])
    return shown


def _shown(a: Answer) -> str:
    """The answer as a person reads it: its text, then its tool calls as ``name(arguments)``."""
    calls = [f"{name}({'…cut' if args is None else args})" for name, args in a.tool_calls]
    return " ".join([a.text, *calls]) if calls else a.text
