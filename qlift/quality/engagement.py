"""Disengaged answers: answers that take up nothing the request asked about.

A deflection needs no refusal word ("Thanks for asking! That is a topic I would rather leave aside, so
let us talk about something else"), and its disguises are many: another language, another subject, the
answer to another request, boilerplate ("Great question! Let me know if you have any other questions"),
"consult a professional" with nothing else. What they share is that they take up none of the request's
content. So the check measures uptake, not phrases: the share of the request's content that the answer
repeats, each content unit weighted by its length (a long word is a rarer one). What a content unit is, per
script (stems, Arabic light stemming, Han pairs, kana words, numbers), is ``content_units``'.

A request is judged when its content weighs as much as three short words or two long ones ("capital of
Australia"): with less, a healthy answer may well repeat none of it. An answer that holds data (code, JSON,
CSV, a table, a directory tree, a display formula) or is verse is not judged when it takes up nothing: its
words need not name the request ("the last five orders as JSON" are records; a haiku about the ocean at night
may say "moonlight on black waves"), and a deflection is prose.

Where the other version's answer to the same request is known (shadow pairs), it sets the standard: an
answer is flagged when it takes up none of the request while the other does and it shares little of the
other's content ("Paris." beside "The capital of France is Paris." shares it). An answer in another language
than the request (asked for, or not: ``off_language`` judges that) takes up none of its words: one in another
script is compared with the other's answer only, when that is in its script; alone, one in another script or
in another language of the same script (by their function words) is not judged.

Measured on tests/engagement_sets.py by benchmarks/engagement.py (rates and cost).
"""

from __future__ import annotations

import re

from qlift.quality.content_units import Content, content
from qlift.quality.language import json_value

MIN_REQUEST_ITEMS, MIN_REQUEST_WEIGHT = 2, 10  # requests with less content are not judged
MIN_ANSWER_WORDS = 10  # shorter answers ("Paris.") are terse, not disengaged, when judged alone
UPTAKE = 0.1  # weighted share of the request's content an engaged answer repeats
SHARED = 0.2  # weighted share of the other answer's content a (long) answer that says the same holds
MIN_DATA_LINES = 3  # CSV and verse: at least this many lines (CSV: each with the same number, 2+, of commas)
MAX_VERSE_LINE = 60  # characters

# a code block, a display formula, a table's rule line, a directory tree
_DATA_BLOCK = re.compile(r"```|\$\$|\\\[|^\s*\|?\s*:?-{3,}:?\s*\||[├└]──", re.MULTILINE)
_LIST_ITEM = re.compile(r"[-*•#>]|\d+[.)、]")
_SENTENCE_END = frozenset(".!?。！？")


def _share(of: Content, within: Content) -> float:
    """The weighted share of ``of``'s content units that ``within`` holds (0 without content)."""
    total = sum(of.items.values())
    taken, halves = 0.0, set()  # one-character words of ``within`` that stood for half a pair already
    held = within.items  # the common case, tested before the call that tries a unit's other forms
    for item, weight in of.items.items():
        if item in held or within.holds(item, of.alternates.get(item)):
            taken += weight
        elif (word := within.half_of(item)) and word not in halves:
            halves.add(word)
            taken += weight / 2
    return taken / total if total else 0.0


def uptake(request: str, answer: str) -> float:
    """The weighted share of the request's content that the answer takes up, 0-1."""
    return _share(content(request), content(answer))


def _shares(answer: Content, other: Content) -> bool:
    """The answer says part of what the other says: a share of the other's content, or, for a short answer,
    most of its own ("Paris." beside "The capital of France is Paris."); a short answer without content
    ("x = 5") has nothing to compare."""
    if answer.words < MIN_ANSWER_WORDS:
        return not answer.items or _share(answer, other) >= 0.5
    return _share(other, answer) >= SHARED


def _is_verse(lines: list[str]) -> bool:
    """Short lines, not list items, most not ending a sentence: a poem, whose words evoke its subject rather
    than name it ("Moonlight on black waves" for the ocean at night)."""
    lines = [line.strip() for line in lines if line.strip()]
    if len(lines) < MIN_DATA_LINES or any(len(line) > MAX_VERSE_LINE or _LIST_ITEM.match(line) for line in lines):
        return False
    return sum(line[-1] in _SENTENCE_END for line in lines) * 2 <= len(lines)


def _is_form(text: str) -> bool:
    """The answer holds a block of data (code, a display formula, a table, a directory tree), is data (JSON,
    CSV) or is verse: a form whose words need not name the request ("the last five orders as JSON" has none)."""
    if _DATA_BLOCK.search(text):
        return True
    body = text.strip()
    if body.startswith(("[", "{")):
        ok, value = json_value(body)
        return ok and isinstance(value, dict | list)
    lines = body.splitlines()
    commas = {line.count(",") for line in lines}
    return len(lines) >= MIN_DATA_LINES and (len(commas) == 1 and min(commas) >= 2 or _is_verse(lines))


def _enough(text: Content) -> bool:
    """The text has content enough that an answer can be expected to take some of it up."""
    return len(text.items) >= MIN_REQUEST_ITEMS and sum(text.items.values()) >= MIN_REQUEST_WEIGHT


def disengaged(prompt: str, answer: str, other: str | None = None) -> bool | None:
    """True when the answer takes up none of the request's content (see the module); None when the request
    has too little content, when the answer is data or verse (``_is_form``), or, without an other answer
    that takes the request up, in another language than the request (another script, or the same one:
    a translation)."""
    req = content(prompt)
    if not _enough(req):
        return None
    ans = content(answer)
    theirs = content(other) if other and other.strip() else None
    if theirs is not None and theirs.script != ans.script:
        theirs = None
    if ans.script != req.script:
        if theirs is None or not _enough(theirs):
            return None
        return not _shares(ans, theirs)
    if _share(req, ans) >= UPTAKE or (theirs is not None and _shares(ans, theirs)):
        return False
    if _is_form(answer):
        return None  # its words need not name the request, nor match the other version's (another poem)
    if theirs is not None and _share(req, theirs) >= UPTAKE:
        return True  # the other version took the request up, and this answer says none of what it said
    if ans.words < MIN_ANSWER_WORDS:
        return False
    # a translation takes up no word of its request: another language in the same script is off_language's
    return None if req.lang and ans.lang and req.lang != ans.lang else True
