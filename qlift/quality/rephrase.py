"""Near-repetition: one claim said several ways, no two sentences alike word for word.

``loops`` sees a unit repeated to the end of an answer; a fine-tune that rambles instead restates
("Your refund is processed. We have processed your refund. The refund has now been processed ...").
Each sentence is reduced to its content units (words other than function words; for CJK, character
pairs), and a sentence restates when most of its units are in the few sentences just before it.
Numbered steps share a verb or two ("Tap Account. Tap Security."), not most of their content, so
they do not restate; comparing each sentence with a short window keeps the cost linear. List items
are parallel by design ("- 苹果：富含维生素C。- 橙子：富含维生素C和叶酸。"): like code, tables and JSON
(records repeat their keys and values), they are not judged.
"""

from __future__ import annotations

import re

from qlift.quality import text as text_tokens
from qlift.quality.language import json_value
from qlift.quality.repetition import CJK, tokens

WINDOW = 4  # a sentence is compared with this many sentences before it
MIN_UNITS = 3  # sentences with fewer content units ("Thanks!", "Tap Save.") are not judged
OVERLAP = 0.5  # share of a sentence's content units found in the WINDOW before it: a restatement
MIN_RESTATED = 3  # restating sentences an answer needs to be flagged ...
MIN_SHARE = 0.25  # ... and their share of its judged sentences

# An end is . ! or ? before whitespace, or 。！？ or a line break ("qlift/spec.py" and "127.0.0.1" are no ends);
# written as one character class and a check behind it, which scans twice as fast as the plain alternation.
_SENTENCE = re.compile(r"[.!?。！？\n](?:(?<=[.!?])(?=\s)|(?<![.!?]))")
_NOT_PROSE = re.compile(r"```.*?(```|\Z)|`[^`\n]*`|^\s*\|.*$|https?://\S+", re.DOTALL | re.MULTILINE)
_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*+•]|\d+[.)、])[ \t].*$", re.MULTILINE)
_WORDS = ("a an the is are was were be been being am to of and or but in on at for with by from as it its this that "
          "these those you your yours we our us i me my he she they them their there here have has had do does did "
          "will would can could should may might must shall not no so if then than also just very all any some more "
          "most now please let know get got up out about into over what which who how when where why")
_HAN_FUNCTION = "的了是在我您你他她它们这那有和就也都吗呢吧啊哦请会将已把被给为对与及或个之并而"
_FUNCTION = frozenset(_WORDS.split(" ")) | frozenset(_HAN_FUNCTION)

# The sets are built by C calls over the whole answer, not token by token in Python (a 900-word answer has
# ~1,000 tokens): the sentence ends are marked in the text, which is tokenized once and split at the marks.
# ASCII text is tokenized as ``tokens`` does (its translation table) with \0 as the mark; other text by ``tokens``
# with _END as the mark: a CJK character is a token of its own, and like \0 it joins nothing when normalized
# or lowercased, so the tokens between two marks are the sentence's. A text holding _END goes a sentence at a time.
_ASCII_WORDS = text_tokens.ASCII_WORDS | {0: "\0"}  # tokens' translation; a \0 of the text's own is made \1 first
_DROP = _FUNCTION | frozenset("abcdefghijklmnopqrstuvwxyz0123456789")  # on ASCII: function words, 1-character tokens
_END = "\u4dbf"
_LONG = re.compile(r"[^ ]{2,}")  # on tokens joined by spaces: the tokens of 2+ characters ...
# ... and the pairs of CJK tokens next to each other, neither a function character
_PAIR = re.compile(rf"(?<![^ ])((?![{_HAN_FUNCTION}])[{CJK}]) (?=((?![{_HAN_FUNCTION}])[{CJK}])(?![^ ]))")


def _units(joined: str) -> set[str]:
    """The content units of one sentence, from its tokens joined by spaces: words other than function words
    and numbers, and CJK character pairs."""
    out = {t for t in _LONG.findall(joined) if t not in _FUNCTION and not t.isdigit()}
    out.update(map("".join, _PAIR.findall(joined)))
    return out


def _prose(text: str) -> str:
    if "`" in text or "|" in text or "://" in text:
        text = _NOT_PROSE.sub("\n", text)
    return _LIST_ITEM.sub("\n", text) if _may_hold_list(text) else text


def _may_hold_list(text: str) -> bool:
    """A line break, or a list marker opening the one line: without either _LIST_ITEM has nothing to match."""
    if "\n" in text:
        return True
    first = text.lstrip(" \t")[:1]
    return first != "" and (first in "-*+•" or first.isdecimal())  # \d: a decimal digit of any script


def sentences(text: str) -> list[str]:
    """The prose sentences: code, tables and URLs are not restatements."""
    return _SENTENCE.split(_prose(text))


def _unit_sets(text: str) -> list[set[str]]:
    """Each prose sentence's content units, in order."""
    text = _prose(text)
    if text.isascii():
        words = _SENTENCE.sub("\0", text.replace("\0", "\1")).translate(_ASCII_WORDS)
        numbers = set(filter(str.isdigit, words.replace("\0", " ").split()))  # dropped too
        return [set(s.split()) - _DROP - numbers for s in words.split("\0")] if numbers else \
            [set(s.split()) - _DROP for s in words.split("\0")]
    if _END in text:
        return [_units(" ".join(tokens(s))) for s in _SENTENCE.split(text)]
    return [_units(s) for s in " ".join(tokens(_SENTENCE.sub(_END, text))).split(_END)]


def restated(text: str) -> tuple[int, int]:
    """(sentences that restate the WINDOW before them, sentences judged)."""
    sets = [u for u in _unit_sets(text) if len(u) >= MIN_UNITS]
    # a sentence's units in none of the WINDOW before it: the difference with each, one C call
    hits = sum(len(u) - len(u.difference(*sets[max(0, i - WINDOW):i])) >= OVERLAP * len(u)
               for i, u in enumerate(sets))
    return hits, len(sets)


def near_repetition(text: str) -> bool | None:
    """True when MIN_RESTATED+ sentences, MIN_SHARE+ of those judged, restate a sentence just before them.
    An answer with too few sentences to restate is not flagged (False, not None: a short stable answer is
    the standard a restating canary answer is compared with); None only without a sentence to judge."""
    if text.lstrip()[:1] in ("{", "[", "`") and json_value(text.strip())[0]:
        return None  # JSON is data, not sentences
    hits, judged = restated(text)
    if not judged:
        return False if _LIST_ITEM.search(text) else None  # a list: sentences, none judged by design
    return judged > MIN_RESTATED and hits >= MIN_RESTATED and hits / judged >= MIN_SHARE
