"""Words of any language, and ROUGE-L over them: one tokenization for every text metric, offline
(``qlift eval``'s rougeL, repetition) and live (the rollout's loop and agreement checks).

rouge-score's tokenizer keeps only ``[a-z0-9]``: a Chinese, Japanese or Russian answer has no tokens
there, and two identical ones score 0. Here a token is one CJK character (Han, kana, Hangul: scripts
written without spaces) or a run of letters and digits of any other script, with its combining marks
(Devanagari vowel signs, Arabic harakat: without them Hindi words would break apart); lowercased, NFC.
Punctuation and ``_`` are not tokens, so on ASCII text the tokens are rouge-score's (``don't`` is
``don``, ``t``) and so are the scores: ``rouge_l`` returns rouge-score's F1, bit for bit.

The longest common subsequence is bit-parallel (Allison-Dix, Hyyro 2004): one row of the DP table is
the bits of a Python int, a step per token of one answer, so two 900-word answers cost ~1k big-int
operations instead of rouge-score's 810k-cell table in pure Python.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"  # scripts written without spaces


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

