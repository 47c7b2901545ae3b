"""Answers whose text is broken in shape, whatever it says: garbled characters, padding, a passage repeated
anywhere in it, chat-template or reasoning debris. A person sees these at a glance; the length, loop and
sentence-end checks do not (a loop is only seen at the end, padding keeps the length, debris mid-answer
ends nothing). Each family is judged by several independent signals:

- characters (``mojibake.py``, over the whole answer): U+FFFD, control, private-use, unassigned and
  surrogate code points, stacked diacritics; mojibake of a dozen codecs, rare Han characters, Hangul or
  half-width kana inside other CJK words; and, in the prose, text escaped twice (``&quot;``, ``\\u00e9``);
- template markers: special-token shapes (``<|...|>``, DeepSeek's ``<｜...｜>``, ``[INST]``, ``<<SYS>>``,
  ``<start_of_turn>``, ``<0x0A>``), ``<s>`` opening the answer and ``</s>`` outside a strikethrough, bare
  role lines that stripped tokens leave ("\\nassistant\\n"), transcript headers ("USER:", "### Response:"),
  tokenizer pieces ("HelloĠworld"), reasoning blocks (``<think>``, ``◁think▷``, ``[THINK]`` ...);
- padding: runs of blank lines, of punctuation/symbols/emoji ("....", "……", "🙂🙂"), of unusual or ASCII
  spaces, zero-width characters, or mostly no letters and digits among the non-space characters;
- repetition: a passage of PASSAGE_TOKENS+ tokens (CJK characters count one each) holding a whole line,
  or twice as long, a prose sentence of SENTENCE_TOKENS+ or any run of PROSE_PASSAGE_TOKENS+ in the prose
  seen twice anywhere; prose where RUN_SHARE of the runs of RUN_TOKENS tokens repeat (a passage said again
  with a few words changed); or prose that zlib compresses below COMPRESSED_SHARE.

The last three read the answer's prose (``language.prose``): code blocks, inline code, URLs and JSON
structure are not judged, so an answer that explains ``<|im_start|>`` in backticks is not flagged; nor
are tables and JSON lines (their cells repeat, and are mostly punctuation) or LaTeX. The cheap test of
each signal comes first (a substring, one regex, n-grams built by ``zip``): 2,000 answers of 200 words
take a fraction of a second (benchmarks/textshape_cost.py).
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Iterator
from itertools import count
from operator import ne

from qlift.quality.language import json_value, prose
from qlift.quality.mojibake import bad_characters, category, mojibake
from qlift.quality.text import ASCII_WORDS, tokens

PASSAGE_TOKENS = 20  # a verbatim run this long that holds a whole line, seen twice, is repeated text ...
SENTENCE_TOKENS = 10  # ... and so is a whole prose sentence this long, seen twice ...
PROSE_PASSAGE_TOKENS = 14  # ... and any run this long in the prose lines (not list items, quotes, headings)
RUN_TOKENS, RUN_SHARE, RUN_MIN_GRAMS = 6, 0.25, 40  # ... and prose where a quarter of the 6-token runs repeat
COMPRESSED_SHARE = 0.25  # prose of COMPRESS_MIN_BYTES+ that zlib shrinks below this share repeats itself
COMPRESS_MIN_BYTES = 600
COMPRESS_MAX_VOCABULARY = 0.5  # ... tried where distinct tokens are at most this share of them
PADDING_SHARE = 0.5  # share of the non-space characters that are no letter or digit ...
PADDING_MIN_CHARS = 40  # ... with at least this many of them
BLANK_LINES = 4  # blank lines in a row
FILLER_RUN = 12  # punctuation, symbols or emoji in a row (spaces between them aside)
INVISIBLE_MIN = 3  # zero-width characters outside a word or emoji sequence
SPACE_RUN = 40  # ASCII spaces in a row outside code and tables (tabs: a quarter)

_SPECIAL_TOKEN = re.compile(
    r"(?:<|&lt;)[|｜][^<>|｜\n]{1,60}[|｜](?:>|&gt;)"  # <|im_start|>, <|eot_id|>, <｜end▁of▁sentence｜> ...
    r"|\[/?(?:INST|SYS|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS)\]|<</?SYS>>"  # Llama 2, Mistral
    r"|</?(?:start|end)_of_(?:turn|text|sentence|message|role|image)>|<(?:bos|eos|eot|eom|pad|unk)>"  # Gemma
    r"|<(?:extra_id|reserved|unused)_?\d+>|<0x[0-9A-F]{2}>|</s>\s*<s>")  # sentinels, byte fallback, Llama 2
_REASONING = re.compile(r"</?[\w:-]*(?:think|thinking|thought|reasoning|reflection|scratchpad)>|◁/?think▷"
                        r"|\[/?THINK\]", re.IGNORECASE)  # <think>, <seed:think>, Kimi's ◁think▷, Magistral's [THINK]
_ROLES = ("system", "user", "assistant", "model")
_ROLE_WORD = re.compile("|".join(_ROLES))  # one scan for any of them
_ROLE_LINE = re.compile(rf"(?:^|\n)({'|'.join(_ROLES)})[ \t]*(?:\n(?=[ \t]*\S)|\s*\Z)")
# transcript headers a model writes when it goes on with the conversation (Vicuna, Alpaca, Anthropic)
_ROLE_HEADER = re.compile(r"^(?:(?:USER|ASSISTANT):|#{2,3} ?(?:Human|Assistant|Instruction|Response):"
                          r"|(?<=\n\n)Human:(?=.*\n\nAssistant:))", re.MULTILINE | re.DOTALL)
_INLINE_MATH = re.compile(r"\$[^$\n]+\$")
_PIECES = re.compile(r"[ĠĊ▁](?<=[^\W\d_][ĠĊ▁])(?=\w)")  # GPT-2/SentencePiece space marks between letters


def _sentence_marks(body: str) -> list[str]:
    """``<s>`` opening the answer, or ``</s>`` with no ``<s>`` before it on its line: HTML's strikethrough
    ``<s>old</s>`` is neither."""
    found = ["<s>"] * (body.lstrip().startswith("<s>") and "</s>" not in body.lstrip().split("\n", 1)[0])
    for m in re.finditer("</s>", body):
        if "<s>" not in body[body.rfind("\n", 0, m.start()) + 1:m.start()]:
            found.append("</s>")
    return found


def template_marker(body: str) -> str | None:
    if "<" in body or "[" in body or "◁" in body:
        found = [m.group().strip() for m in _SPECIAL_TOKEN.finditer(body)] + _sentence_marks(body)
        if found:
            reasoning = all(re.search("think|thought|reason", t, re.IGNORECASE) for t in found)
            return f"{'reasoning block' if reasoning else 'template marker'}: {found[0]!r}" \
                + (f" x{len(found)}" if len(found) > 1 else "")
        if m := _REASONING.search(body):
            return f"reasoning block: {m.group()!r}"
    if ("Ġ" in body or "Ċ" in body or "▁" in body) and len(pieces := _PIECES.findall(body)) >= 3:
        return f"tokenizer pieces: {Counter(pieces).most_common(1)[0][0]!r} x{len(pieces)}"
    if _ROLE_WORD.search(body) and (m := _ROLE_LINE.search(body)) and body.strip() != m.group(1):
        return f"template marker: role line {m.group(1)!r}"
    if ":" in body and (m := _ROLE_HEADER.search(body)):
        return f"template marker: role header {m.group()!r}"
    return None


_ESCAPE = re.compile(r"&(?:#\d{2,7}|#x[0-9a-fA-F]{2,6}|amp|quot|apos|lt|gt|nbsp);|\\(?:u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}"
                     r"|x[0-9a-fA-F]{2})")
ESCAPES = 3  # HTML entities or backslash escapes in prose: text escaped twice, or bytes printed as text


def escaped(body: str) -> str | None:
    """``&quot;``, ``&#39;``, ``\\u00e9``, ``\\xc3`` in the prose: what a reader sees where text was escaped twice."""
    if "&" not in body and "\\" not in body or len(found := _ESCAPE.findall(body)) < ESCAPES:
        return None
    return f"escaped characters: {Counter(found).most_common(1)[0][0]!r} x{len(found)}"


_TRAILING_DEBRIS = re.compile(
    rf"(?:{_SPECIAL_TOKEN.pattern}|{_REASONING.pattern}|</s>|(?:\n|(?<=>))(?:{'|'.join(_ROLES)})|\s)+\Z",
    re.IGNORECASE)
TAIL = 400  # the end of an answer searched for debris


def without_trailing_markers(text: str) -> str:
    """The text with template tokens, role lines and an unclosed reasoning block at its end removed: what the
    model said before the debris (the sentence-end check judges that, and text_shape names the debris)."""
    if (i := text.rfind("<think>")) >= 0 and "</think>" not in text[i:]:
        text = text[:i]
    end = text.rstrip()
    if end[-1:] not in (">", "]", "▷") and not end.endswith(_ROLES):
        return text  # debris ends in a token's bracket or a role's name
    m = _TRAILING_DEBRIS.search(text, max(0, len(text) - TAIL))
    return text[:m.start()] if m else text


_DATA_CHAR = re.compile(r'[|{\["]')  # where _DATA_LINE is worth running (one scan)
_DATA_LINE = re.compile(r"^[ \t]*[|{}\[\]\"].*(?:\n|\Z)", re.MULTILINE)  # a table row, JSON: cells repeat
_RULE_LINE = re.compile(r"^[ \t]*(?:[-=_*~#+|:<>][ \t]*){3,40}(?:\n|\Z)", re.MULTILINE)  # a rule, not a wall
_RULE_CHARS = frozenset("-=_*~#+|:<>")  # what a one-line text opens with where _RULE_LINE can match it
_MATH = re.compile(r"\$\$.*?\$\$|\\\[.*?\\\]|\$[^$\n]+\$|\\\(.*?\\\)", re.DOTALL)  # LaTeX is no padding
_BLANK_RUN = re.compile(rf"\n(?:[^\S\n]*\n){{{BLANK_LINES},}}")
_FILLER = re.compile(rf"[^\w\s]{{{FILLER_RUN},}}")  # over the text without its whitespace
_SPACE_RUN = re.compile(rf"[ \t]{{{SPACE_RUN},}}|\t{{{SPACE_RUN // 4},}}")
_ODD_SPACES = re.compile(r"[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]{3,}")
_INVISIBLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064"
                        "\u2066-\u206f\u2800\u3164\ufeff\uffa0\U000e0000-\U000e007f]+")


def _letter(ch: str) -> bool:
    """A letter or mark of a script that joiners and soft hyphens belong in (CJK has no use for them)."""
    return category(ch)[0] in "LM" and ch < "\u2e80"


def _emoji(ch: str) -> bool:
    return ch >= "\U0001f000" or ch == "\ufe0f" or category(ch) == "So"


def _spaceless(ch: str) -> bool:
    return "\u0e00" <= ch <= "\u109f" or "\u1780" <= ch <= "\u17ff"  # Thai, Lao, Tibetan, Myanmar, Khmer


def _writing(prev: str, ch: str, after: str) -> bool:
    """One invisible character between ``prev`` and ``after`` that the text's writing uses: a ZWJ in an emoji
    sequence or an Indic word, a ZWNJ in Persian, a soft hyphen, a bidi mark, a ZWSP between Thai words."""
    if ch in "\u200e\u200f\u061c":
        return True
    if ch == "\u200d":
        return _emoji(prev) and _emoji(after) or _letter(prev) and _letter(after)
    if ch in "\u200c\u00ad":
        return _letter(prev) and _letter(after)
    return ch == "\u200b" and _spaceless(prev) and _spaceless(after)


def _invisible(body: str) -> int:
    n = 0
    for m in _INVISIBLE.finditer(body):
        run, start, end = m.group(), m.start(), m.end()
        if len(run) == 1 and start > 0 and end < len(body) and _writing(body[start - 1], run, body[end]):
            continue
        if run[0] >= "\U000e0000" and start and ord(body[start - 1]) == 0x1F3F4:
            continue  # the tag characters of a flag emoji (England, Scotland, Wales)
        n += len(run)
    return n


def padding(plain: str, toks: list[str]) -> str | None:
    """``plain``: the prose without tables and JSON lines; ``toks``: its tokens."""
    if "$" in plain or "\\" in plain:
        plain = _MATH.sub(" ", plain)
    body = _RULE_LINE.sub("", plain) if "\n" in plain or plain.lstrip(" \t")[:1] in _RULE_CHARS else plain
    if m := _BLANK_RUN.search(body):
        return f"padding: {m.group().count(chr(10)) - 1} blank lines in a row"
    dense = "".join(body.split())
    if m := _FILLER.search(dense):
        return f"padding: a run of {len(m.group())} characters, mostly {Counter(m.group()).most_common(1)[0][0]!r}"
    if (" " * 8 in body or "\t" * 4 in body) and (m := _SPACE_RUN.search(body)):
        return f"padding: a run of {len(m.group())} spaces and tabs"
    if not body.isascii():
        if (n := _invisible(body)) >= INVISIBLE_MIN:
            return f"padding: {n} zero-width characters"
        if m := _ODD_SPACES.search(body):
            return f"padding: a run of {len(m.group())} spaces ({m.group()[0]!r})"
    filler = len(dense) - sum(map(len, toks))  # tokens: the letters and digits (and their marks)
    if filler >= PADDING_MIN_CHARS and filler >= PADDING_SHARE * len(dense):
        return f"padding: {filler / len(dense):.0%} of its non-space characters are punctuation, symbols or emoji"
    return None


_SENTENCE_END = re.compile(r"(?<=[.!?。！？])")
_NOT_PROSE_LINE = re.compile(r"^\s*([-*+•>#|]|\d+[.)]\s)")  # list item, quote, heading, table row
_REFRAIN = re.compile(r"^\W*(chorus|pre-chorus|refrain|副歌|サビ|후렴|припев|estribillo|ritornello)\b",
                      re.IGNORECASE | re.MULTILINE)  # a song's chorus is meant to come back


class _Runs:
    """The runs of RUN_TOKENS tokens of a token list, each as an id (equal runs, equal ids; built by zip and
    map: no Python step per token), so that a longer run is compared as a few ids, not as its tokens."""

    def __init__(self, toks: list[str]) -> None:
        first: dict[tuple[str, ...], int] = {}
        self.ids = list(map(first.setdefault, zip(*(toks[i:] for i in range(RUN_TOKENS)), strict=False), count()))
        self.distinct = len(first)
        self._seen: dict[int, list[int]] = {RUN_TOKENS: self.ids}

    def repeat(self, n: int) -> bool:
        """Some run of ``n`` >= RUN_TOKENS tokens occurs twice: the ids of the runs that cover it, twice."""
        if n == RUN_TOKENS:
            return self.distinct < len(self.ids)
        runs = len(self.ids) - (n - RUN_TOKENS)
        return runs > 0 and len(set(self._covering(n))) < runs

    def _covering(self, n: int) -> Iterator[tuple[int, ...]]:
        """Each run of ``n`` >= RUN_TOKENS tokens as the ids of runs of RUN_TOKENS that cover it."""
        at = sorted({*range(0, n - RUN_TOKENS + 1, RUN_TOKENS), n - RUN_TOKENS})
        return zip(*(self.ids[i:] for i in at), strict=False)

    def first_seen(self, n: int) -> list[int]:
        """For each run of ``n`` tokens, where it first occurs (ids count the calls: the first call a run makes
        stores its own index)."""
        if n not in self._seen:
            first: dict[tuple[int, ...], int] = {}
            self._seen[n] = list(map(first.setdefault, self._covering(n), count()))
        return self._seen[n]

    def passages(self, n: int) -> Iterator[tuple[int, int]]:
        """(start, length) of each maximal run of ``n``+ tokens that appeared earlier: the positions whose run
        of ``n`` was first seen before them, found as runs of 1 bytes."""
        seen = self.first_seen(n)
        earlier = bytes(map(ne, seen, range(len(seen))))
        return ((m.start(), m.end() - m.start() + n - 1) for m in _ONES.finditer(earlier))


_ONES = re.compile(b"\x01+")


def _unit(toks: list[str] | tuple[str, ...]) -> str:
    return "character" if 2 * sum(len(t) == 1 and t >= "\u3040" for t in toks) > len(toks) else "word"


def _passage(toks: list[str], runs: _Runs, found: list[tuple[int, int]], k: int) -> str:
    """The evidence for the longest of the (length, start) runs ``found``: its length and how often it occurs."""
    length, start = max(found)
    seen = runs.first_seen(k)
    return f"repeated: a {length}-{_unit(toks)} passage appears {seen.count(seen[start])}x"


def repeated_passage(body: str, toks: list[str], runs: _Runs) -> str | None:
    """A run of 2 x PASSAGE_TOKENS+ tokens, or of PASSAGE_TOKENS+ holding a whole line, seen twice. A list
    of similar items shares a line's tail ("..., closed for lunch between 12 and 1 p.m."), not a line.
    ``toks`` and ``runs``: the body's tokens and their runs (where its lines' tokens are the same)."""
    by_line: list[str] = []
    lines: list[tuple[int, int]] = []
    for line in body.splitlines():
        more = tokens(line)
        if len(more) >= 3:
            lines.append((len(by_line), len(by_line) + len(more)))
        by_line += more
    if by_line != toks:
        toks, runs = by_line, _Runs(by_line)
    found = [(length, start) for start, length in runs.passages(PASSAGE_TOKENS)
             if length >= 2 * PASSAGE_TOKENS or any(start <= a and b <= start + length for a, b in lines)]
    return _passage(toks, runs, found, PASSAGE_TOKENS) if found else None


def _sentence_key(sentence: str) -> tuple[str, ...]:
    """A sentence's tokens, each inline formula kept whole: "$x < -1$" and "$x > 1$" have the same tokens."""
    if "$" not in sentence:
        return tuple(tokens(sentence))
    return (*tokens(_INLINE_MATH.sub(" ", sentence)), *_INLINE_MATH.findall(sentence))


_SENTENCE_WORDS = ASCII_WORDS | {ord(c): "\0" for c in ".!?"}  # tokens' translation, a sentence end marked
_END_MARK = "\u4dbf"  # a CJK character: a token of its own, neither cased nor a mark, so it joins nothing


def _sentence_keys(line: str) -> list[tuple[str, ...]]:
    """``_sentence_key`` of each piece of the line split after a sentence end. A line without formulas is
    tokenized once, its ends marked (tokens do not cross them, nor does case or normalisation): an ASCII one by
    the translation, another with _END_MARK, unless it holds that character."""
    if "$" not in line:
        if line.isascii():
            return [tuple(piece.split()) for piece in line.translate(_SENTENCE_WORDS).split("\0")]
        if _END_MARK not in line:
            joined = " ".join(tokens(_SENTENCE_END.sub(_END_MARK, line)))
            return [tuple(piece.split()) for piece in joined.split(_END_MARK)]
    return [_sentence_key(sentence) for sentence in _SENTENCE_END.split(line)]


def repeated_sentence(body: str) -> str | None:
    """A sentence of SENTENCE_TOKENS+ seen twice where once at least it stands alone: in a prose line, as a
    whole list item, or twice in one item. The items of a list may share one ("- Monday: 9 to 6. Book ahead
    for visits of more than thirty minutes.")."""
    seen: Counter[tuple[str, ...]] = Counter()
    alone: set[tuple[str, ...]] = set()
    for line in body.splitlines():
        item = _NOT_PROSE_LINE.match(line)
        keys = [key for key in _sentence_keys(line) if len(key) >= SENTENCE_TOKENS]
        seen.update(keys)
        if not item or len(keys) > len(set(keys)) or keys and keys[0] == tuple(tokens(line[item.end():])):
            alone.update(keys)
    repeated = [(n, key) for key, n in seen.items() if n > 1 and key in alone]
    if not repeated:
        return None
    n, key = max(repeated)
    return f"repeated: a sentence of {len(key)} {_unit(key)}s appears {n}x"


def repeated_in_prose(prose_toks: list[str], runs: _Runs) -> str | None:
    """A run of PROSE_PASSAGE_TOKENS+ seen twice in the prose lines, wherever it starts and ends (healthy
    prose in nine languages repeats 8 at most); ``runs``: the prose tokens' runs."""
    if not runs.repeat(PROSE_PASSAGE_TOKENS):
        return None
    return _passage(prose_toks, runs, [(n, i) for i, n in runs.passages(PROSE_PASSAGE_TOKENS)],
                    PROSE_PASSAGE_TOKENS)


def repeated_runs(prose_toks: list[str], runs: _Runs) -> str | None:
    """RUN_SHARE+ of the prose's runs of RUN_TOKENS tokens seen earlier in it: a passage said again with a
    few words changed."""
    grams = len(runs.ids)
    if grams < RUN_MIN_GRAMS or (share := 1 - runs.distinct / grams) < RUN_SHARE:
        return None
    return f"repeated: {share:.0%} of its {RUN_TOKENS}-{_unit(prose_toks)} runs appear earlier in it"


def repetition(text: str, plain: str, toks: list[str]) -> str | None:
    if _REFRAIN.search(plain) or text.lstrip()[:1] in "[{" and json_value(text)[0]:
        return None  # a song, or JSON records whose string values repeat field by field
    runs = _Runs(toks)
    if runs.repeat(RUN_TOKENS):  # else nothing of that length or longer repeats
        if runs.repeat(PASSAGE_TOKENS) and (found := repeated_passage(plain, toks, runs)):
            return found
        lines = plain.splitlines()  # the prose: list items, quotes and headings share their wording
        prose_toks, prose_runs = (tokens("\n".join(line for line in lines if not _NOT_PROSE_LINE.match(line))), None) \
            if any(_NOT_PROSE_LINE.match(line) for line in lines) else (toks, runs)
        if found := repeated_sentence(plain):
            return found
        prose_runs = prose_runs or _Runs(prose_toks)
        if found := repeated_in_prose(prose_toks, prose_runs) or repeated_runs(prose_toks, prose_runs):
            return found
    raw = plain.encode()
    if len(raw) < COMPRESS_MIN_BYTES or len(set(toks)) > COMPRESS_MAX_VOCABULARY * len(toks):
        return None  # a text that uses this many different words does not compress that far
    if (share := len(zlib.compress(raw, 1)) / len(raw)) < COMPRESSED_SHARE:
        return f"repeated: the text compresses to {share:.0%} of its size"
    return None


def text_shape(text: str) -> str | None:
    """What is wrong with the answer's text, for a person to read ("mojibake (cp1252): 'Ã©' x4 (was 'é')",
    "template marker: '<|im_start|>'"), or None when its shape is healthy (and for an empty answer)."""
    if not text.strip():
        return None
    if evidence := mojibake(text) or bad_characters(text):
        return evidence  # code blocks too: garbled is garbled anywhere
    body = prose(text)
    if evidence := template_marker(body) or escaped(body):
        return evidence
    plain = _DATA_LINE.sub("", body) if _DATA_CHAR.search(body) else body
    toks = tokens(plain)
    return padding(plain, toks) or repetition(text, plain, toks)
