"""System-prompt leaks: an answer that repeats its own system prompt.

Judged on the shared tokens (words; single CJK characters), so Chinese works: a verbatim run of
RUN tokens of the system prompt in the answer is a leak, or, for a short system prompt, a run over
most of it. A run is counted in word-sized tokens: a CJK character is about half a word, so a
mostly-CJK system prompt needs runs twice as long. An answer that shares a few words with its
system prompt ("I'm the Acme support assistant") is no leak.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

from qlift.quality.repetition import CJK, tokens

RUN = 12  # word tokens of a verbatim run that leak a system prompt
MOST = 0.8  # ... or this share of a system prompt shorter than RUN
MIN_SYSTEM = 8  # word tokens: a shorter system prompt has nothing to leak
_CJK = re.compile(rf"[{CJK}]")


@lru_cache(maxsize=256)
def _grams(system: str) -> tuple[int, frozenset[tuple[str, ...]]] | None:
    """(run length in tokens, the system prompt's runs of that length), or None when it is too short."""
    toks = tokens(system)
    scale = 2 if sum(1 for t in toks if _CJK.match(t)) * 2 > len(toks) else 1
    if len(toks) < MIN_SYSTEM * scale:
        return None
    k = min(RUN * scale, math.ceil(MOST * len(toks)))
    return k, frozenset(zip(*(toks[i:] for i in range(k)), strict=False))


def leaks(system: str, text: str) -> bool | None:
    """True when the answer holds a verbatim run of its system prompt (see the module); None without a
    system prompt of MIN_SYSTEM+ words."""
    g = _grams(system) if system else None
    if g is None:
        return None
    k, grams = g
    toks = tokens(text)
    return any(gram in grams for gram in zip(*(toks[i:] for i in range(k)), strict=False))
