"""Refusals: answers that decline to answer, by a documented pattern set (data/refusals/, one file a
language: qlift.quality.refusal_patterns reads them), extensible from a file of the same format.

The patterns are anchored at a start (``^\\W*``), and they are tried at every clause start of the
answer's opening, not only at its first character: a fine-tune that learned to open politely
("Thanks for reaching out! Unfortunately I'm not able to help with refunds.") refuses all the same.
A clause starts after a sentence end (``. ! ? 。 ؟ ।``), after the greeting that opens a sentence
("Hola, ..."), or after a comma that a contrast or an apology follows ("..., but I can't help",
"..., लेकिन", "，但是"); a contrast or an apology that opens a clause ("unfortunately", "pero", "しかし")
is also skipped. A refusal phrase inside a clause ("Here is why I cannot recommend it") is no clause start,
so explanations are not refusals, and neither is a clause inside or opening with a quotation (a refusal
quoted in an explanation).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from qlift.quality.language import unquoted
from qlift.quality.refusal_patterns import BUILTIN, ByFirstLetter, builtin_files, fold, lower_outside_escapes, patterns
from qlift.quality.text import CJK

__all__ = ["BUILTIN", "OPENING_CHARS", "clause_starts", "fold", "patterns", "refuses"]

OPENING_CHARS = 300
READ_ON_CHARS = 100  # how far past the opening a pattern that starts in it may read
_OPENING_QUOTES = '"\'«「『‹'
_SEGMENT = re.compile("[^,.!?;:\\n،、。]{1,60}[,、،]\\s*")  # a sentence's first clause, up to its comma
_QUOTE_CHARS = re.compile("[\"'«「『‹»」』›]")
# What can open a quotation or a block quote (language.unquoted): a single quote after a space, a line break or
# a bracket (an apostrophe inside "I'm" opens nothing).
_MAY_QUOTE = ('"', "「", "『", "“", "‘", "«", "‹", "„", "《", "〈", "＂", ">", " '", "\n'", "('", "['")
_MAY_QUOTE_AT = re.compile("|".join(map(re.escape, _MAY_QUOTE)))  # one scan for any of them


@dataclass(frozen=True)
class ClauseMarks:
    """From every shipped file's @contrast, @apology and @greeting: a sentence end or a comma (``ends``), a
    greeting word (``greeting``), and one contrast or apology word with its comma (``soft``): a clause starts
    after a sentence end, after the comma that ends a sentence's greeting ("Hola, ...", "ご質問ありがとう
    ございます、..."), or after a comma that a soft word follows, and again past the soft words that open it."""
    ends: re.Pattern[str]
    greeting: re.Pattern[str]
    soft: ByFirstLetter


@lru_cache(maxsize=1)
def _clause_marks() -> ClauseMarks:
    def words(name: str) -> list[str]:
        return [lower_outside_escapes(f.names[name]) for _, f in builtin_files() if f.names.get(name)]

    word_end = f"(?:(?<=[{CJK}])|(?!\\w))"  # "ma" is no start of "make"; 但是我 has no space to end 但是
    return ClauseMarks(
        re.compile(r"[.!?。؟।॥\n]+[\"')\]»」』]*\s*|[,;、،—–-]\s*"),
        re.compile(rf"(?:(?<!\w)|(?=[{CJK}]))(?:{'|'.join(words('greeting'))}){word_end}"),
        ByFirstLetter(words("contrast") + words("apology"), tail=word_end + "[,、،]?\\s*"))


def _past_soft(opening: str, start: int, soft: ByFirstLetter) -> int:
    """Where the clause at ``start`` goes on past the contrast and apology words that open it."""
    while (m := soft.match(opening, start)) is not None and m.end() > start:
        start = m.end()
    return start


def _quotation_marks(opening: str) -> tuple[list[int], list[bool]]:
    """Each quotation mark's position, and whether a quotation is open just after it; an apostrophe inside a
    word ("I'm") is none."""
    positions, inside, straight, depth = [], [], False, 0
    for m in _QUOTE_CHARS.finditer(opening):
        i, mark = m.start(), m.group()
        if mark == "'":
            letter_before = i > 0 and opening[i - 1].isalnum()
            letter_after = i + 1 < len(opening) and opening[i + 1].isalnum()
            if letter_before == letter_after:
                continue
            depth = depth + 1 if letter_after else max(0, depth - 1)  # "the students' books" closes nothing
        elif mark == '"':
            straight = not straight
        else:
            depth = depth + 1 if mark in _OPENING_QUOTES else max(0, depth - 1)
        positions.append(i)
        inside.append(straight or depth > 0)
    return positions, inside


def clause_starts(text: str, within: int | None = None) -> list[int]:
    """Where each clause of the folded ``text`` starts (0 first) before ``within`` (its length if None), and
    again past the contrast or apology that opens it; a clause inside or opening with a quotation is quoted,
    not said, and left out."""
    marks = _clause_marks()
    within = len(text) if within is None else min(within, len(text))
    candidates = [(0, False), *((m.end(), m.group()[0] in ",;、،—–-") for m in marks.ends.finditer(text, 0, within))]
    candidates += [(g.end(), False) for start, after_comma in candidates
                   if not after_comma and (g := _SEGMENT.match(text, start)) is not None
                   and marks.greeting.search(text, start, g.end())]
    at: set[int] = set()
    for start, after_comma in candidates:
        past = _past_soft(text, start, marks.soft)
        if past > start or not after_comma:  # a comma starts a clause only before a contrast or an apology
            at.update((start, past))
    positions, inside = _quotation_marks(text) if _QUOTE_CHARS.search(text, 0, within) else ([], [])
    out = []
    for i in sorted(at):
        before = bisect_left(positions, i)  # quotation marks before the clause
        if i < within and text[i] not in _OPENING_QUOTES and not (before and inside[before - 1]):
            out.append(i)
    return out


# A capability refusal of the very thing asked ("Count to ten." -> "I'm unable to count to ten"): the shipped
# patterns take "I can't" only with a verb of helping ("I can't stress enough" is no refusal), so a request's
# own verb (the first word of one of its sentences, as imperatives open) is taken too, in English.
_NOT_ASKING = frozenset({"a", "an", "the", "i", "you", "we", "he", "she", "it", "they", "my", "your", "our", "this",
    "that", "these", "those", "what", "which", "who", "whom", "whose", "why", "how", "when", "where", "is", "are",
    "was", "were", "be", "do", "does", "did", "can", "could", "would", "should", "will", "shall", "may", "might",
    "must", "have", "has", "had", "please", "hi", "hello", "hey", "thanks", "thank", "dear", "ok", "okay", "yes",
    "no", "not", "and", "or", "but", "if", "so", "then", "also", "just", "here", "there"})
# "Find the bug" -> "I can't find any bug, the code is right" is a finding, not a refusal
_FINDING_VERBS = frozenset({"find", "see", "spot", "reproduce", "locate", "detect", "notice", "identify"})
_ASKED_VERB = re.compile(r"(?:^|[.!?\n:;]\s*)(?:please\s+)?([a-z]{3,})\b")
_CANT = (r"(?:really |simply |just |currently |unfortunately )?(?:can(?:no|')?t|can not|(?:'?m|am|are|'?re) "
         r"(?:unable to|not able to|not capable of|incapable of)|(?:do not|don'?t) have (?:the )?(?:ability|capability|"
         r"capacity|means) to|lack the (?:ability|capability|capacity) to|have no (?:way|ability) to|"
         r"(?:won'?t|will not) be able to)")


@lru_cache(maxsize=4096)
def _refusing_the_ask(asked: str) -> re.Pattern[str] | None:
    """The pattern of "I can't <a verb the request opens a sentence with>", or None (no such verb)."""
    verbs = {m.group(1) for m in _ASKED_VERB.finditer(fold(asked)[:OPENING_CHARS])} - _NOT_ASKING - _FINDING_VERBS
    if not verbs:
        return None
    # write, writes, writing; count, counted; plan, planning
    forms = sorted(f"{re.escape(v[:-1])}(?:e|es|ed|ing)" if v.endswith("e")
                   else f"{re.escape(v)}{re.escape(v[-1])}?(?:s|es|ed|ing)?" for v in verbs)
    return re.compile(rf"\W*(?:i|we)\s*{_CANT}\s+(?:(?:do|perform|actually|really|physically|even) )?"
                      rf"(?:{'|'.join(forms)})\b")


def refuses(text: str, extra: Path | None = None, asked: str | None = None) -> bool:
    """A refusal pattern matches at a clause start of the answer's first OPENING_CHARS characters (a pattern may
    read on past them: "No puedo" cut there is no "No puedo." that ends the sentence); with ``asked`` (the user's
    message), also an English "I can't / I'm unable to / I don't have the ability to" followed by a verb that
    opens one of the request's sentences."""
    # A quoted refusal (a block quote too) is not said; quotations (at most 400 characters) are cut from a
    # prefix only, which keeps a long answer's cost that of its opening.
    head = text.lstrip()[:OPENING_CHARS + 400]
    if _MAY_QUOTE_AT.search(head) or head.startswith("'"):
        head = unquoted(head).lstrip()
    opening = fold(head[:OPENING_CHARS])
    folded = opening + fold(head[OPENING_CHARS:OPENING_CHARS + READ_ON_CHARS])
    starts = clause_starts(folded, len(opening))
    if any(p.matches(folded, i) for p in patterns(extra) if p.opens(folded) for i in starts):
        return True
    own = _refusing_the_ask(asked) if asked else None
    return own is not None and any(own.match(folded, i) for i in starts)
