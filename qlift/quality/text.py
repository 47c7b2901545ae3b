"""Words of any language, and ROUGE-L over them: one tokenization for every text metric, offline
(``qlift eval``'s rougeL, repetition) and live (the rollout's loop and agreement checks).

rouge-score's tokenizer keeps only ``[a-z0-9]``: a Chinese, Japanese or Russian answer has no tokens
there, and two identical ones score 0. Here a token is one CJK character (Han, kana, Hangul, Bopomofo:
the ``UNSPACED_SCRIPTS`` with ``char_tokens``) or a run of letters and digits of any other script (Thai
too), with its combining marks (Devanagari vowel signs, Arabic harakat: without them Hindi words would
break apart); lowercased, NFC.
Punctuation and ``_`` are not tokens, so on ASCII text the tokens are rouge-score's (``don't`` is
``don``, ``t``) and so are the scores: ``rouge_l`` returns rouge-score's F1, bit for bit.

The longest common subsequence is bit-parallel (Allison-Dix, Hyyro 2004): one row of the DP table is
the bits of a Python int, a step per token of one answer, so two 900-word answers cost ~1k big-int
operations instead of rouge-score's 810k-cell table in pure Python.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Script:
    """A script written without spaces between words: the router's filter matches its rules anywhere in it,
    not on word edges. ``char_tokens``: each character is a token of the text checks (an ideograph or a
    syllable); otherwise a token is a run of its letters, as in any other script (a Thai letter is a letter)."""

    name: str
    ranges: tuple[tuple[int, int], ...]  # first and last code point, inclusive
    char_tokens: bool


UNSPACED_SCRIPTS = (
    Script("Thai and Lao", ((0x0E00, 0x0EFF),), char_tokens=False),
    Script("Myanmar", ((0x1000, 0x109F),), char_tokens=False),
    Script("Khmer", ((0x1780, 0x17FF),), char_tokens=False),
    Script("Han", ((0x2E80, 0x2FDF), (0x3190, 0x319F), (0x31C0, 0x31EF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF),
                   (0xF900, 0xFAFF), (0x20000, 0x3134F)), char_tokens=True),  # radicals, kanbun, strokes, ext. A-H
    Script("Kana", ((0x3040, 0x30FF), (0x31F0, 0x31FF)), char_tokens=True),
    Script("Bopomofo", ((0x3100, 0x312F), (0x31A0, 0x31BF)), char_tokens=True),
    # Korean spaces its phrases, not its words: particles and endings join the word ("폭탄을")
    Script("Hangul", ((0xAC00, 0xD7AF),), char_tokens=True),
)


def char_class(scripts: Iterable[Script]) -> str:
    """The scripts' code points as a regex character class body (``[...]`` without the brackets)."""
    return "".join(f"{chr(lo)}-{chr(hi)}" for script in scripts for lo, hi in script.ranges)


UNSPACED = char_class(UNSPACED_SCRIPTS)
CJK = char_class(s for s in UNSPACED_SCRIPTS if s.char_tokens)  # each character a token


def _mark_ranges(stop: int = 0x20000) -> str:
    """Every combining mark (Unicode category M*) below ``stop``, as a regex class body: Python's
    ``re`` has no ``\\p{M}``, and ``\\w`` leaves marks out."""
    spans: list[list[int]] = []
    for cp in range(0x300, stop):
        if unicodedata.category(chr(cp))[0] == "M":
            if spans and spans[-1][1] == cp - 1:
                spans[-1][1] = cp
            else:
                spans.append([cp, cp])
    return "".join(chr(a) if a == b else f"{chr(a)}-{chr(b)}" for a, b in spans)


_MARKS = _mark_ranges()
# The same tokens on ASCII text, lowercased and split in one pass (1.6x a findall over ``[a-z0-9]+``).
ASCII_WORDS = str.maketrans({chr(c): chr(c).lower() if chr(c).isalnum() else " " for c in range(128)})
_TOKEN = re.compile(rf"[{CJK}]|[^\W_{CJK}]+")
_MARKED_TOKEN = re.compile(rf"[{CJK}]|[^\W_{CJK}]+(?:[{_MARKS}]+[^\W_{CJK}]*)*")  # slower: only where marks are


REMEMBERED_CHARS = 200  # texts this long (answers, not their lines or sentences) have their tokens remembered


def tokens(text: str) -> list[str]:
    """The text's tokens: lowercased CJK characters and runs of letters/digits (with their marks). An answer's
    are remembered: the loop, text-shape and engagement checks all read them (each gets its own list)."""
    return list(_remembered(text)) if len(text) >= REMEMBERED_CHARS else _tokens(text)


@lru_cache(maxsize=8192)
def _remembered(text: str) -> tuple[str, ...]:
    return tuple(_tokens(text))


def _tokens(text: str) -> list[str]:
    if text.isascii():
        return text.translate(ASCII_WORDS).split()
    text = unicodedata.normalize("NFC", text).lower()
    return (_MARKED_TOKEN if _has_mark(text) else _TOKEN).findall(text)


_ASCII_TOKEN = re.compile(r"[A-Za-z0-9]+")


def token_spans(text: str) -> list[tuple[str, int, int]]:
    """``tokens`` with where each one starts and ends: offsets into ``text`` itself, so a caller that wants
    ``tokens``' NFC normalisation normalises ``text`` first (NFC can change its length)."""
    if text.isascii():
        return [(m[0].lower(), m.start(), m.end()) for m in _ASCII_TOKEN.finditer(text)]
    pattern = _MARKED_TOKEN if _has_mark(text) else _TOKEN
    return [(m[0].lower(), m.start(), m.end()) for m in pattern.finditer(text)]


def span_tokens(text: str) -> list[str]:
    """The tokens of ``token_spans``, without their offsets: C calls, no Python step a token."""
    if text.isascii():
        return text.translate(ASCII_WORDS).split()
    return list(map(str.lower, (_MARKED_TOKEN if _has_mark(text) else _TOKEN).findall(text)))


@lru_cache(maxsize=65536)
def _is_mark(ch: str) -> bool:
    return unicodedata.category(ch)[0] == "M"


def _has_mark(text: str) -> bool:
    """Whether any character is a combining mark: over the distinct characters, each looked up once a process
    (a regex class of the 768 mark ranges costs ~0.3 ms on one Chinese answer; this, ~20 µs)."""
    return any(map(_is_mark, set(text)))


def lcs_length(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence of two token lists (bit-parallel over the longer one)."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return 0
    where: dict[str, int] = {}  # token -> bits of its positions in ``a``
    for i, tok in enumerate(a):
        where[tok] = where.get(tok, 0) | (1 << i)
    full = (1 << len(a)) - 1
    row = full  # a 0 bit marks a position where the LCS grew
    for tok in b:
        match = where.get(tok)
        if match:
            hit = row & match
            row = ((row + hit) | (row - hit)) & full
    return len(a) - row.bit_count()


def f1(lcs: int, reference_len: int, candidate_len: int) -> float:
    """rouge-score's F1 from an LCS length, computed as it does (precision, recall, then their harmonic
    mean) so that the floats are identical: reports and gates on English text do not move."""
    if not reference_len or not candidate_len:
        return 0.0
    precision, recall = lcs / candidate_len, lcs / reference_len
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def rouge_l(reference: str, candidate: str, *, max_tokens: int | None = None) -> float:
    """ROUGE-L F1 of ``candidate`` against ``reference`` over ``tokens`` (0 when either has none); with
    ``max_tokens``, over each text's first that many tokens (the live check's cost bound)."""
    ref, cand = tokens(reference), tokens(candidate)
    if max_tokens is not None:
        ref, cand = ref[:max_tokens], cand[:max_tokens]
    return f1(lcs_length(ref, cand), len(ref), len(cand))

