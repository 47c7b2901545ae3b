"""Near-repetition: one claim said several ways, no two sentences alike word for word.

``loops`` sees a unit repeated to the end of an answer; a fine-tune that rambles instead restates
("Your refund is processed. We have processed your refund. The refund has now been processed ...").
Each sentence is reduced to its content units (words other than function words; for CJK, character
pairs), and a sentence restates when most of its units are in the few sentences just before it.
Numbered steps share a verb or two ("Tap Account. Tap Security."), not most of their content, so
they do not restate; comparing each sentence with a short window keeps the cost linear.
"""

from __future__ import annotations

import re

from qlift.quality.repetition import CJK, tokens

WINDOW = 4  # a sentence is compared with this many sentences before it
MIN_UNITS = 3  # sentences with fewer content units ("Thanks!", "Tap Save.") are not judged
OVERLAP = 0.5  # share of a sentence's content units found in the WINDOW before it: a restatement
MIN_RESTATED = 3  # restating sentences an answer needs to be flagged ...
MIN_SHARE = 0.25  # ... and their share of its judged sentences

_SENTENCE = re.compile(r"[.!?](?=\s)|[。！？\n]")  # "qlift/spec.py" and "127.0.0.1" are no ends
_CJK = re.compile(rf"[{CJK}]")
_NOT_PROSE = re.compile(r"```.*?(```|\Z)|`[^`\n]*`|^\s*\|.*$|https?://\S+", re.DOTALL | re.MULTILINE)
_WORDS = ("a an the is are was were be been being am to of and or but in on at for with by from as it its this that "
          "these those you your yours we our us i me my he she they them their there here have has had do does did "
          "will would can could should may might must shall not no so if then than also just very all any some more "
          "most now please let know get got up out about into over what which who how when where why")
_FUNCTION = frozenset(_WORDS.split(" ")) | frozenset(
    "的了是在我您你他她它们这那有和就也都吗呢吧啊哦请会将已把被给为对与及或个之并而")


def _units(sentence: str) -> set[str]:
    toks = tokens(sentence)
    out = {t for t in toks if len(t) > 1 and t not in _FUNCTION and not t.isdigit()}
    if not sentence.isascii():  # CJK characters are single tokens: their content units are pairs
        cjk = [t if len(t) == 1 and _CJK.match(t) and t not in _FUNCTION else "" for t in toks]
        out.update(a + b for a, b in zip(cjk, cjk[1:], strict=False) if a and b)
    return out


def sentences(text: str) -> list[str]:
    """The prose sentences: code, tables and URLs are not restatements."""
    if "`" in text or "|" in text or "://" in text:
        text = _NOT_PROSE.sub("\n", text)
    return _SENTENCE.split(text)


def restated(text: str) -> tuple[int, int]:
    """(sentences that restate the WINDOW before them, sentences judged)."""
    sets = [u for s in sentences(text) if len(u := _units(s)) >= MIN_UNITS]
    hits = 0
    for i, u in enumerate(sets):
        need = OVERLAP * len(u)
        seen = frozenset().union(*sets[max(0, i - WINDOW):i])
        if len(u & seen) >= need:
            hits += 1
    return hits, len(sets)


def near_repetition(text: str) -> bool | None:
    """True when MIN_RESTATED+ sentences, MIN_SHARE+ of those judged, restate a sentence just before them;
    None for answers of fewer than MIN_RESTATED + 1 judged sentences."""
    hits, judged = restated(text)
    if judged <= MIN_RESTATED:
        return None
    return hits >= MIN_RESTATED and hits / judged >= MIN_SHARE
