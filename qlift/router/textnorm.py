"""Text normalisation for the content filter, and where in a request its text lives.

Both the rules and the request text go through :func:`normalize`, so a rule matches whatever
way the client spelled it: full-width letters, ligatures, zero-width or other format
characters, doubled spaces and line breaks, upper or lower case.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import Any

# Scripts written without spaces between words: their rules match anywhere, not on word boundaries.
from qlift.quality.text import UNSPACED as _UNSPACED_RANGES

_UNSPACED = re.compile(f"[{_UNSPACED_RANGES}]")
_SPACED_WORD = re.compile(f"[^\\W{_UNSPACED_RANGES}]")  # a word character of a script that spaces its words
EDGE = "\x00"  # marks word edges; normalize() removes it (and every other control character) from text

# Format characters (Unicode Cf: zero-width, bidi marks, soft hyphen, tags) and controls other than
# whitespace, as of Unicode 15.1 (a test checks this covers the running Python's tables).
INVISIBLE_RANGES = (
    (0x00, 0x08), (0x0E, 0x1B), (0x7F, 0x84), (0x86, 0x9F), (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C),
    (0x6DD, 0x6DD), (0x70F, 0x70F), (0x890, 0x891), (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200F),
    (0x202A, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)
_LONE_SURROGATES = (0xD800, 0xDFFF)  # valid in JSON escapes, not text: dropped too
_DROP = dict.fromkeys(c for lo, hi in (*INVISIBLE_RANGES, _LONE_SURROGATES) for c in range(lo, hi + 1))


_ASCII_CONTROLS = re.compile("[\x00-\x08\x0e-\x1b\x7f]")
_SPACED_WORD_RUNS = re.compile(f"({_SPACED_WORD.pattern}+)")
_ASCII_WORD_RUNS = re.compile(r"([A-Za-z0-9_]+)")  # the same for ASCII text, much faster


def normalize(text: str) -> str:
    """NFKC, without format and control characters, whitespace runs as one space, casefolded."""
    text = unicodedata.normalize("NFKC", text)
    if not text.isascii() or _ASCII_CONTROLS.search(text):
        text = text.translate(_DROP)
    return " ".join(text.split()).casefold()


def mark_word_edges(text: str) -> str:
    """``text`` (or a rule) with EDGE wherever a word of a spaced script starts or ends.

    ``a bomb!`` becomes ``|a| |bomb|!`` (``|`` being EDGE). Rule and text marked alike, a rule
    matches as a plain substring: whole words in scripts that space their words (``|bomb|`` is
    not in ``|bombastic|``, but is in ``我想做|bomb|``); anywhere in CJK, Thai and the like,
    whose characters get no marks (``炸弹`` is in ``如何制作炸弹``); anywhere for punctuation.
    """
    runs = _ASCII_WORD_RUNS if text.isascii() else _SPACED_WORD_RUNS
    return EDGE.join(runs.split(text))


_SPACE_IN_UNSPACED = re.compile(f"(?<=[{_UNSPACED_RANGES}]) (?=[{_UNSPACED_RANGES}])")


def join_unspaced(text: str) -> str:
    """Normalised ``text`` without the spaces between two CJK (Thai, ...) characters: ``炸 弹`` is ``炸弹``."""
    return _SPACE_IN_UNSPACED.sub("", text) if " " in text else text


def has_unspaced(text: str) -> bool:
    """Some character of ``text`` is of a script without spaces between words."""
    return _UNSPACED.search(text) is not None


def is_unspaced(char: str) -> bool:
    """A character of a script without spaces between words (CJK, Thai, ...)."""
    return bool(_UNSPACED.match(char))


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included, without recursion (bodies are depth-checked before)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for k, v in item.items():
                if isinstance(k, str):
                    yield k
                stack.append(v)
        elif isinstance(item, list):
            stack.extend(reversed(item))


def request_texts(body: dict[str, Any]) -> Iterator[str]:
    """Every text a request can carry to the model, whatever the route: every string in the body.

    Nothing is picked field by field, so no route's field can be missed (chat ``documents``,
    ``chat_template``, Anthropic ``system`` blocks and ``tool_use`` inputs, score and rerank texts,
    ...). Keys are texts too below the top level, where vLLM renders them (``chat_template_kwargs``,
    tool parameter schemas, tool call inputs); the top level's keys are the API's parameter names.
    """
    for value in body.values():
        yield from _strings(value)


# Where a route takes its prompt: vLLM's lax pydantic reads a list of numbers (9906.0, true) there as token ids.
PROMPT_FIELDS = ("prompt", "input", "text_1", "text_2", "queries", "query", "documents", "texts", "messages",
                 "content", "system")


def _number(value: Any) -> bool:
    return isinstance(value, int | float)  # bool is an int


def _has_numbers(value: Any) -> bool:
    """A number or boolean as the value, an element, or an element of an element (list[list[int]])."""
    if _number(value):
        return True
    if isinstance(value, list):
        return any(_number(v) or (isinstance(v, list) and any(_number(t) for t in v)) for v in value)
    return False


def has_token_ids(body: dict[str, Any]) -> bool:
    """A prompt no text filter can read: numbers or booleans where a prompt goes (token ids, however
    spelled: ``[9906, 1917]``, ``[9906.0]``, ``[true, 9906]``, ``[[1, 2]]``), at the top level or in a
    message's ``content``, or vLLM's ``prompt_embeds``."""
    if body.get("prompt_embeds") is not None:
        return True
    if any(_has_numbers(body.get(k)) for k in PROMPT_FIELDS):
        return True
    messages = body.get("messages")
    return isinstance(messages, list) and any(isinstance(m, dict) and _has_numbers(m.get("content"))
                                              for m in messages)


def _ids_in(value: Any) -> int:
    if not isinstance(value, list):
        return 0
    return sum(len(v) if isinstance(v, list) else 1 for v in value if _number(v) or isinstance(v, list))


def estimate_tokens(body: dict[str, Any]) -> int:
    """A cheap upper-leaning estimate of a request's prompt tokens: charged before the answer exists.

    About 4 characters a token for English text, and about one token for each character
    outside ASCII (a CJK character is one token or more); token-id prompts count their ids;
    ``data:`` URLs (images, audio) are not text and are not counted.
    The estimate is replaced by the backend's usage once the answer is done.
    """
    total = 0
    for text in request_texts(body):
        if text.startswith("data:"):
            continue
        chars, extra = len(text), len(text.encode("utf-8", "surrogatepass")) - len(text)  # 2 per CJK character
        total += (chars + 2 * extra) // 4 + 1
    for key in ("prompt", "input"):
        if _has_numbers(body.get(key)):
            total += _ids_in(body.get(key))
    return max(1, total)


def json_depth(value: Any, limit: int) -> int:
    """How deeply ``value`` nests (stopping at ``limit + 1``), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest
