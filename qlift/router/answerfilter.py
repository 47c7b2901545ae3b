"""The content filter applied to answers: a blocked word never reaches the client, whole or streamed.

A whole answer is checked at once; on a hit its text is cut before the match and its
``finish_reason`` becomes ``content_filter`` (what OpenAI-compatible gateways such as Azure OpenAI
answer). A stream is checked as it passes: each choice's text is held back by the longest match
the rules can make (``max_match_chars``: the longest word, a regex's own maximum width, at most
``filters.REGEX_MATCH_CHARS``), so a word split across chunks is seen whole before any of it goes
out. Whole SSE lines are held, never rewritten, so a clean answer reaches the client byte for byte
(only later). On a hit the text before the match goes out, then a chunk whose ``finish_reason`` is
``content_filter``, then ``data: [DONE]``; the rest of the backend's stream is dropped.

A whole chat answer's tool calls are checked too (their arguments, JSON escapes decoded): the first call
that matches is dropped with every call after it. A stream's tool-call pieces are not held or checked.

The held window is counted in characters that survive normalisation (whitespace, zero-width and
combining characters count for nothing), so a word spelled with spaces or invisible characters
between its letters is still held whole, up to ``MAX_HELD_CHARS`` characters of the answer.
"""

from __future__ import annotations

import json
import unicodedata
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qlift.router.memsize import compact_json
from qlift.router.textnorm import INVISIBLE_RANGES

Check = Callable[[str], Any]  # ContentFilter.check: a FilterHit or None
SENTINEL = "_"  # a word character, "more text follows": ``bomb_`` holds no whole word ``bomb`` (ASCII: fast checks)
DEFAULT_MATCH_CHARS = 64  # a plugged-in filter's longest match, when it does not say (max_match_chars)
MAX_HELD_CHARS = 4096  # a stream's text held back at most, whatever it is made of (bounds the cost of a check)
_SKIP = frozenset(chr(c) for lo, hi in INVISIBLE_RANGES for c in range(lo, hi + 1)) | frozenset(" \t\n\r\f\v")


@dataclass(frozen=True)
class AnswerFilter:
    """A filter as the answer path uses it: its check, and how many characters a match can span."""

    check: Check
    hold: int

    @classmethod
    def of(cls, content_filter: Any) -> AnswerFilter:
        """From a ContentFilter; its ``max_match_chars`` (read now: a reload may change it) or a default."""
        hold = getattr(content_filter, "max_match_chars", DEFAULT_MATCH_CHARS)
        return cls(content_filter.check, max(1, int(hold)))


def significant_start(text: str, n: int) -> int:
    """The start of the shortest tail of ``text`` holding ``n`` characters that normalisation keeps (0: none)."""
    count = 0
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        if c in _SKIP or (c > "\x7f" and (unicodedata.combining(c) or c.isspace())):
            continue
        count += 1
        if count >= n:
            return i
    return 0


def _wordish(c: str) -> bool:
    return c.isalnum() or c == "_"


def definite(check: Check, text: str) -> bool:
    r"""A match in ``text`` that no continuation can undo: one with more text to come (``SENTINEL``: ``bomb``
    at the end may be the start of ``bombastic``) and one without (a pattern ending in ``\w`` would match the
    sentinel itself)."""
    return check(text + SENTINEL) is not None and check(text) is not None


def _hits(check: Check, text: str, start: int, end: int, final: bool) -> bool:
    """A hit in text[start:end], read as a piece of ``text``: mid-word edges are no word edges."""
    left = SENTINEL if 0 < start < len(text) and _wordish(text[start - 1]) and _wordish(text[start]) else ""
    piece = left + text[start:end]
    return check(piece) is not None if final and end == len(text) else definite(check, piece)


def cut_before_hit(check: Check, text: str, *, final: bool) -> int:
    """Where to cut ``text``, known to hold a hit: before the first match (the shortest prefix holding one,
    then the latest start that still holds it). ``final``: the text's end is the answer's end."""
    lo, hi = 1, len(text)
    while lo < hi:
        mid = (lo + hi) // 2
        if _hits(check, text, 0, mid, final):
            hi = mid
        else:
            lo = mid + 1
    for start in range(lo - 1, -1, -1):
        if _hits(check, text, start, lo, final):
            return start
    return 0


class TextGuard:
    """One choice's streamed text: what may go to the client (``safe``, an offset into the whole text), and
    where it is cut once a match is seen (``cut``). Keeps the held text and as much released text before it
    as a match can reach back, nothing more."""

    def __init__(self, flt: AnswerFilter) -> None:
        self.flt = flt
        self.buf = ""  # released context + held text
        self.base = 0  # offset of buf[0] in the choice's whole text
        self.held_from = 0  # index in buf of the first held character
        self.cut: int | None = None

    @property
    def total(self) -> int:
        return self.base + len(self.buf)

    @property
    def safe(self) -> int:
        return self.cut if self.cut is not None else self.base + self.held_from

    def feed(self, piece: str) -> bool:
        """Take more text; True when it completes a match (``cut`` is set)."""
        if self.cut is not None or not piece:
            return self.cut is not None
        self.buf += piece
        if self.flt.check(self.buf + SENTINEL) is not None and self.flt.check(self.buf) is not None:
            return self._cut(final=False)
        hold = self.flt.hold
        release = max(significant_start(self.buf, hold + 1), len(self.buf) - MAX_HELD_CHARS)
        self.held_from = max(self.held_from, release)
        if self.held_from > 4 * hold + 64:  # enough released text kept for a match reaching back: drop the rest
            keep = max(significant_start(self.buf[:self.held_from], hold + 2), self.held_from - MAX_HELD_CHARS)
            self.buf, self.base, self.held_from = self.buf[keep:], self.base + keep, self.held_from - keep
        return False

    def finish(self) -> bool:
        """The choice's text is complete: check its end as an end; True on a match, else everything is safe."""
        if self.cut is not None:
            return True
        if self.buf and self.flt.check(self.buf) is not None:
            return self._cut(final=True)
        self.held_from = len(self.buf)
        return False

    def _cut(self, *, final: bool) -> bool:
        at = cut_before_hit(self.flt.check, self.buf, final=final)
        self.cut = self.base + max(at, self.held_from)  # released text was clean: the match starts after it
        return True


def _choice_text(choice: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the text a chunk or answer choice carries, where: "text" or "content")."""
    text = choice.get("text")
    if isinstance(text, str):
        return text, "text"
    part = choice.get("delta") or choice.get("message")
    content = part.get("content") if isinstance(part, dict) else None
    return (content, "content") if isinstance(content, str) else (None, None)


def _set_text(choice: dict[str, Any], where: str | None, text: str) -> None:
    """Put ``text`` where _choice_text found the choice's text."""
    if where == "text":
        choice["text"] = text
    elif where == "content":
        part = choice.get("delta") or choice.get("message")
        if isinstance(part, dict):
            part["content"] = text


def filter_whole(flt: AnswerFilter, answer: dict[str, Any]) -> bool:
    """Cut each choice of a whole answer before its first match (``finish_reason`` content_filter); True if any.
    A chat answer's tool calls too: the first call whose arguments match goes, with every call after it."""
    cut = False
    for choice in answer.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        calls_cut = _filter_calls(flt, choice.get("message"))
        text, where = _choice_text(choice)
        if text and flt.check(text) is not None:
            _set_text(choice, where, text[:cut_before_hit(flt.check, text, final=True)])
        elif not calls_cut:
            continue
        choice["finish_reason"] = "content_filter"
        cut = True
    return cut


def arguments_text(arguments: str) -> str:
    """A tool call's arguments as the filter reads them: their JSON with escapes decoded (``\\u70b8`` is 炸),
    or the string as sent where it is no JSON."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        return arguments


def _filter_calls(flt: AnswerFilter, message: Any) -> bool:
    """Drop a message's tool calls from the first one whose arguments hold a match; True if one did."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list):
        return False
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if isinstance(args, str) and flt.check(arguments_text(args)) is not None:
            message["tool_calls"] = calls[:i]  # [] as vLLM answers without calls
            return True
    return False


@dataclass
class _Held:
    line: bytes
    event: dict[str, Any] | None = None
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # choice index -> its text's (start, end)
    finishes: set[int] = field(default_factory=set)  # choices whose finish_reason this line carries


class StreamFilter:
    """Holds a stream's SSE lines until the text in them is known clean, in order; cuts the stream at a match.

    ``line`` takes each line (its parsed event, for ``data:`` lines) and returns the lines that may go to the
    client now; ``end`` the rest at the stream's end. ``stopped``: cut, nothing more goes out.
    """

    def __init__(self, flt: AnswerFilter, rewrite: Callable[[bytes], bytes] | None = None) -> None:
        self.flt = flt
        self.rewrite = rewrite
        self.guards: dict[int, TextGuard] = {}
        self.held: deque[_Held] = deque()
        self.finished: set[int] = set()  # choices whose finish_reason reached the client
        self.template: dict[str, Any] = {}
        self.kind = "content"
        self.stopped = False
        self.last_blank = True

    def line(self, line: bytes, event: Any = None, *, done: bool = False) -> list[bytes]:
        if self.stopped:
            return []
        if event is None and not done and not self.held:  # nothing held before it and no text in it
            self.last_blank = line in (b"", b"\r")
            return [line]
        held, hit = _Held(line), False
        if isinstance(event, dict) and isinstance(event.get("choices"), list):
            held.event = event
            hit = self._take(event, held)
        if done:
            hit = any([g.finish() for g in self.guards.values()]) or hit
        self.held.append(held)
        return self._cut() if hit else self._release()

    def end(self) -> list[bytes]:
        """The backend's stream ended (without [DONE], or broke): what is clean goes out, or the cut."""
        if self.stopped:
            return []
        hit = any([g.finish() for g in self.guards.values()])
        return self._cut() if hit else self._release()

    def cut_at(self, index: int) -> int | None:
        """Where choice ``index``'s text was cut (an offset into it), once stopped."""
        guard = self.guards.get(index)
        return None if guard is None or not self.stopped else guard.safe

    def _take(self, event: dict[str, Any], held: _Held) -> bool:
        self.template = {k: event[k] for k in ("id", "object", "created", "model") if k in event}
        hit = False
        for choice in event["choices"]:
            if not isinstance(choice, dict) or not isinstance(choice.get("index", 0), int):
                continue
            index = choice.get("index", 0)
            guard = self.guards.get(index)
            if guard is None:
                guard = self.guards[index] = TextGuard(self.flt)
            text, where = _choice_text(choice)
            if where == "text":
                self.kind = "text"
            if text:
                start = guard.total
                hit = guard.feed(text) or hit
                held.spans[index] = (start, start + len(text))
            if choice.get("finish_reason"):
                held.finishes.add(index)
                hit = guard.finish() or hit
        return hit

    def _clean(self, held: _Held) -> bool:
        return all(end <= self.guards[i].safe for i, (_start, end) in held.spans.items())

    def _emit(self, held: _Held, out: list[bytes]) -> None:
        out.append(held.line)
        self.finished |= held.finishes
        self.last_blank = held.line in (b"", b"\r")

    def _release(self) -> list[bytes]:
        out: list[bytes] = []
        while self.held and self._clean(self.held[0]):
            self._emit(self.held.popleft(), out)
        return out

    def _cut(self) -> list[bytes]:
        """What goes out at a match: the clean lines, the text before the match, content_filter, [DONE]."""
        out = self._release()
        self.stopped = True
        if self.held and self.held[0].event is not None:
            part = self._before_cut(self.held[0])
            if part is not None:
                out += [part, b""]
                self.last_blank = True
        self.held.clear()
        if not self.last_blank:
            out.append(b"")
        out += [self._line(self._final_event()), b"", b"data: [DONE]", b""]
        return out

    def _before_cut(self, held: _Held) -> bytes | None:
        """The line that holds the match's start, with only the text before it (None when that is no text)."""
        assert held.event is not None
        keep = False
        for choice in held.event["choices"]:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            start, _end = held.spans.get(index, (0, 0))
            text, where = _choice_text(choice)
            part = text[:max(0, self.guards[index].safe - start)] if text else text
            keep = keep or bool(part)
            if part is not None:
                _set_text(choice, where, part)
            choice["finish_reason"] = None
        return self._line(held.event) if keep else None

    def _final_event(self) -> dict[str, Any]:
        ends = [i for i in sorted(self.guards) if i not in self.finished] or [0]
        body: dict[str, Any] = {"text": ""} if self.kind == "text" else {"delta": {}}
        choices = [{"index": i, **body, "finish_reason": "content_filter"} for i in ends]
        return {**self.template, "choices": choices}

    def _line(self, event: dict[str, Any]) -> bytes:
        line = b"data: " + compact_json(event)
        return self.rewrite(line) if self.rewrite else line

