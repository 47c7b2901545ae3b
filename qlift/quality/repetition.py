"""Repetition: the share of an answer's n-grams that repeat, and whether it ends in a loop.

Tokens are ``qlift.quality.text``'s: words, and single characters of scripts written without spaces
(CJK), so a Chinese answer that loops is seen as one that repeats words. Punctuation is not a token:
a markdown table's ``|---|`` rules do not count.
"""

from __future__ import annotations

import re

from qlift.quality.text import CJK as CJK  # re-exported: language.py and older callers import it here
from qlift.quality.text import tokens as tokens

NGRAM = 4
MIN_TOKENS = 8  # shorter answers have no repetition share
LOOP_MIN_TOKENS = 12  # a loop covers at least this many tokens ...
LOOP_MIN_REPEATS = 3  # ... and its unit repeats at least this many times, to the end of the answer
LOOP_MAX_UNIT = 64  # the longest repeating unit looked for, in tokens
LOOP_TAIL = 1024  # tokens of the answer's end that are searched
_CLOSED_CODE = re.compile(r"```.*?```", re.DOTALL)  # data, not prose: a zero matrix, a column of equal values


def repeated_share(text: str, n: int = NGRAM) -> float | None:
    """Share of the answer's n-grams seen earlier in it (0: none repeat); None under MIN_TOKENS."""
    toks = tokens(text)
    if len(toks) < max(MIN_TOKENS, n):
        return None
    grams = [tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams)


def loop_length(toks: list[str]) -> int:
    """Tokens at the end of ``toks`` that repeat one unit (0 when none do): the longest run over the
    unit sizes whose period holds to the last token."""
    toks = toks[-LOOP_TAIL:]
    n = len(toks)
    if n < LOOP_MIN_TOKENS:
        return 0
    best = 0
    last = toks[-1]
    at = n - 1 - min(LOOP_MAX_UNIT, n // LOOP_MIN_REPEATS)  # the unit sizes p whose token p back is the last one:
    while (at := _find(toks, last, at, n - 1)) >= 0:  # found by list.index, not a Python step per size
        p = n - 1 - at
        at += 1
        i = n - 1
        while i - p >= 0 and toks[i] == toks[i - p]:
            i -= 1
        covered = n - 1 - i + p  # the unit plus every token that repeats it
        if covered >= max(LOOP_MIN_TOKENS, LOOP_MIN_REPEATS * p):
            best = max(best, covered)
    return best


def _find(toks: list[str], tok: str, start: int, stop: int) -> int:
    try:
        return toks.index(tok, start, stop)
    except ValueError:
        return -1


def loops(text: str) -> bool:
    """The answer ends in a unit of 1..64 tokens repeated 3 or more times over 12 or more tokens (its last
    token aside: an answer cut at max_tokens may end mid-word). A closed code block is not searched: a model
    that loops does not close its block (an unclosed one is searched)."""
    toks = tokens(_CLOSED_CODE.sub(" ", text) if "```" in text else text)
    return loop_length(toks) > 0 or loop_length(toks[:-1]) > 0
