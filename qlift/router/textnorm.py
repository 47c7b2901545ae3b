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
_UNSPACED_RANGES = (
    "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3190-\u31ff"
    "\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f"
)
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


def is_unspaced(char: str) -> bool:
    """A character of a script without spaces between words (CJK, Thai, ...)."""
    return bool(_UNSPACED.match(char))


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string in a JSON value, keys included (tool parameter names are text the model reads)."""
    if depth > 64:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str):
                yield k
            yield from _strings(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, depth + 1)


def _content(content: Any) -> Iterator[str]:
    """A message's or an input item's content: a string, or a list of parts with text."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                yield part
            elif isinstance(part, dict):
                for key in ("text", "input_text", "refusal"):
                    if isinstance(part.get(key), str):
                        yield part[key]


def request_texts(body: dict[str, Any]) -> Iterator[str]:
    """Every text a request can carry to the model, whatever the endpoint.

    Chat messages (content as a string or parts, ``name``, tool calls' names and arguments),
    tool and function definitions (names, descriptions, parameter schemas), ``prompt`` and
    ``suffix`` of completions, ``input`` and ``instructions`` of /v1/responses and embeddings,
    and a JSON response schema.
    """
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        yield from _content(message.get("content"))
        for key in ("name", "reasoning_content"):
            if isinstance(message.get(key), str):
                yield message[key]
        yield from _strings(message.get("tool_calls"))
        yield from _strings(message.get("function_call"))
    for key in ("tools", "functions", "tool_choice", "response_format", "text"):
        yield from _strings(body.get(key))
    for key in ("prompt", "suffix", "instructions", "system"):
        value = body.get(key)
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            yield from (v for v in value if isinstance(v, str))
    value = body.get("input")
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, str):
                yield item
            elif isinstance(item, dict):
                yield from _content(item.get("content"))
                yield from (item[k] for k in ("text", "name", "arguments", "output")
                            if isinstance(item.get(k), str))


def _is_token_ids(value: Any) -> bool:
    if isinstance(value, list) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return True
        return any(isinstance(v, list) and v and all(isinstance(t, int) for t in v) for v in value)
    return False


def has_token_ids(body: dict[str, Any]) -> bool:
    """A prompt no text filter can read: ``prompt`` or ``input`` as token ids (a list of ints, or of
    lists of ints), or vLLM's ``prompt_embeds``."""
    return _is_token_ids(body.get("prompt")) or _is_token_ids(body.get("input")) or \
        body.get("prompt_embeds") is not None


def estimate_tokens(body: dict[str, Any]) -> int:
    """A cheap upper-leaning estimate of a request's prompt tokens: charged before the answer exists.

    About 4 characters a token for English text, and about one token for each character
    outside ASCII (a CJK character is one token or more); token-id prompts count their ids.
    The estimate is replaced by the backend's usage once the answer is done.
    """
    total = 0
    for text in request_texts(body):
        chars, extra = len(text), len(text.encode("utf-8", "surrogatepass")) - len(text)  # 2 per CJK character
        total += (chars + 2 * extra) // 4 + 1
    for key in ("prompt", "input"):
        value = body.get(key)
        if isinstance(value, list) and _is_token_ids(value):
            total += sum(len(v) if isinstance(v, list) else 1 for v in value)
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
