"""The language of an answer against the language of the prompt it answers.

Two steps, cheapest first: the writing system (Han, kana, Hangul, Cyrillic, Arabic, Latin ...),
counted in units (a CJK character or a word of any other script, so "iPhone" in a Chinese answer
is one unit, not six letters); then, within one script, py3langid (its model ships inside its
wheel: nothing is downloaded) on texts long enough for it. Code blocks, inline code, URLs and
JSON structure are not language: a JSON answer is judged on its string values.

A share catches an answer that drifted; a code switch is one clause of another language inside an
answer in the right one ("Your refund is processed, 请耐心等待三到五个工作日, and ..."), under any
share. It is a run of SWITCH_UNITS+ consecutive units of another script that reads as language,
not as a name: a Han run holds a function character (的, 了, 请 ...; a city, an address or a brand
has none), a Latin run holds English function words ("iPhone 15 Pro Max" has none). A quoted run
("the phrase “一路顺风” means ...") is a quotation, not a switch.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from functools import lru_cache
from itertools import islice
from operator import itemgetter
from typing import Any

from qlift.quality.repetition import CJK

MIN_UNITS = 4  # fewer units of text: no language to tell
MIN_LANGID_LETTERS = 40  # py3langid within one script only above about this many letters
ENGLISH_TEST_CHARS = 3000  # the opening the stopword test reads: a long answer's language is settled by then
LANGID_CHARS = 600  # the opening py3langid reads: enough to tell, and its cost grows with the text
FOREIGN_SHARE = 0.3  # an answer with this share of its units in another script drifted ...
MIN_FOREIGN_UNITS = 6  # ... if there are at least this many of them
SWITCH_UNITS = 6  # a run of this many units of another script, read as language: a code switch

_CODE = re.compile(r"```.*?(```|$)|`[^`\n]*`", re.DOTALL)
_URL = re.compile(r"\bhttps?://\S+|\b[\w.+-]+@[\w-]+\.[\w.-]+")
_UNITS = re.compile(rf"[{CJK}]|[^\W\d_{CJK}]+")  # a CJK character, or a run of other letters
_ASCII_LETTERS = str.maketrans({chr(c): chr(c) if chr(c).isalpha() else " " for c in range(128)})  # _UNITS on ASCII
_ENGLISH_WORD = re.compile(r"[A-Za-z']+")
_SCRIPT_OF_NAME = {"CJK": "han", "HIRAGANA": "kana", "KATAKANA": "kana", "HANGUL": "hangul", "LATIN": "latin",
                   "CYRILLIC": "cyrillic", "GREEK": "greek", "ARABIC": "arabic", "HEBREW": "hebrew",
                   "DEVANAGARI": "devanagari", "THAI": "thai"}
_LANG_OF_SCRIPT = {"han": "zh", "kana": "ja", "hangul": "ko", "greek": "el", "hebrew": "he", "thai": "th"}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def prose(text: str) -> str:
    """The natural-language part of an answer: JSON string values, no code, no URLs."""
    from qlift.quality.schema import parse_json_output

    ok, value = parse_json_output(text)
    if ok and isinstance(value, dict | list):
        text = "\n".join(_strings(value))
    if "`" in text:  # the substitutions cost a scan each, so only texts that can match pay for one
        text = _CODE.sub(" ", text)
    return _URL.sub(" ", text) if "://" in text or "@" in text else text


@lru_cache(maxsize=4096)
def _script(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return _SCRIPT_OF_NAME.get(name.split(" ", 1)[0], "other")


def script_units(text: str) -> dict[str, int]:
    """Units of text per script, in the order each script first appears (``max`` breaks ties by it). Counted
    per distinct first character, not per unit: a long answer has thousands of units and a few hundred."""
    if text.isascii():  # every unit is a run of Latin letters
        n = len(text.translate(_ASCII_LETTERS).split())
        return {"latin": n} if n else {}
    counts: dict[str, int] = {}
    for ch, n in Counter(map(itemgetter(0), _UNITS.findall(text))).items():
        s = _script(ch)
        counts[s] = counts.get(s, 0) + n
    return counts


@lru_cache(maxsize=1)
def _langid() -> Any:
    import py3langid

    return py3langid


@lru_cache(maxsize=8192)
def _profile(text: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    """(prose, units per script): one pass a text, remembered (a prompt is judged for both versions)."""
    body = prose(text)
    return body, tuple(script_units(body).items())


def detect(text: str) -> str | None:
    """An ISO 639-1 code for the text's language, or None when it is too short or not language."""
    body, counted = _profile(text)
    units = dict(counted)
    if sum(units.values()) < MIN_UNITS:
        return None
    script = max(units, key=lambda s: units[s])
    if script == "han" and units.get("kana"):
        return "ja"
    if script in _LANG_OF_SCRIPT:
        return _LANG_OF_SCRIPT[script]
    if script == "latin" and _looks_english(body[:ENGLISH_TEST_CHARS]):
        return "en"  # the stopword test settles most English at a fraction of py3langid's cost
    if script == "latin" and units[script] * 5 < MIN_LANGID_LETTERS:
        return None
    lang, _ = _langid().classify(body[:LANGID_CHARS])
    return None if lang == "zxx" else str(lang)


_ENGLISH = frozenset({"the", "a", "an", "is", "are", "was", "be", "to", "of", "and", "in", "on", "for", "it", "that",
                      "this", "with", "you", "your", "i", "we", "not", "can", "please", "thanks", "order", "at",
                      "have", "has", "will", "my", "our", "if", "by", "from", "what", "how", "do", "does"})


def _looks_english(text: str) -> bool:
    words = _ENGLISH_WORD.findall(text)
    return bool(words) and sum(map(_ENGLISH.__contains__, map(str.lower, words))) / len(words) >= 0.2


_HAN_FUNCTION = frozenset("的了是我您你请們们吗呢这這那会會将將已把被在")
_QUOTES_OPEN = "\"'“‘「『《(（"
_QUOTES_CLOSE = "\"'”’」』》)）"


def _reads_as_language(script: str, units: list[str]) -> bool:
    if script == "han":
        return sum(u in _HAN_FUNCTION for u in units) >= 1
    if script == "latin":
        return sum(u.lower() in _ENGLISH for u in units) >= 2
    return True


_SCRIPT_CODE = {s: chr(ord("A") + i) for i, s in enumerate(sorted({*_SCRIPT_OF_NAME.values(), "other"}))}
_RUN = re.compile(rf"([^.])\1{{{SWITCH_UNITS - 1},}}")  # SWITCH_UNITS+ units of one script outside ``allowed``


def _unit_span(body: str, first: int, last: int) -> tuple[int, int]:
    """Where units ``first`` to ``last`` - 1 (indices in ``_UNITS.findall(body)``) start and end in ``body``."""
    spans = [m.span() for m in islice(_UNITS.finditer(body), first, last)]
    return spans[0][0], spans[-1][1]


def switches(allowed: frozenset[str], body: str) -> bool:
    """The answer's prose ``body`` holds a run of SWITCH_UNITS+ units of a script outside ``allowed`` that
    reads as language and is not quoted (see the module). The units are written as one letter each, their
    script's ("." where allowed), and one regex finds the runs in that string: no Python step per unit."""
    units = _UNITS.findall(body)
    firsts = list(map(itemgetter(0), units))
    code = {ch: "." if (s := _script(ch)) in allowed else _SCRIPT_CODE[s] for ch in set(firsts)}
    for run in _RUN.finditer("".join(map(code.__getitem__, firsts))):
        first, last = run.span()
        if not _reads_as_language(_script(firsts[first]), units[first:last]):
            continue
        start, end = _unit_span(body, first, last)
        before, after = body[:start].rstrip()[-1:], body[end:].lstrip()[:1]
        if not (before and before in _QUOTES_OPEN and after and after in _QUOTES_CLOSE):
            return True
    return False


def off_language(prompt: str, answer: str) -> bool | None:
    """True when the answer is (partly) in another language than the prompt; None when either side has
    too little text to tell (a JSON answer of ids and numbers, a one-word prompt)."""
    p_units, a_units = dict(_profile(prompt)[1]), dict(_profile(answer)[1])
    if sum(p_units.values()) < MIN_UNITS or sum(a_units.values()) < MIN_UNITS:
        return None
    p_script = max(p_units, key=lambda s: p_units[s])
    # the scripts of the prompt's language: Japanese writes Han and kana, so a kana prompt allows both
    allowed = frozenset({p_script, "other"} | ({"han", "kana"} if p_units.get("kana") else set()))
    foreign = sum(n for s, n in a_units.items() if s not in allowed)
    if foreign >= MIN_FOREIGN_UNITS and foreign / sum(a_units.values()) >= FOREIGN_SHARE:
        return True
    if foreign >= SWITCH_UNITS and switches(allowed, _profile(answer)[0]):
        return True
    if p_script == "kana" and not a_units.get("kana") and a_units.get("han", 0) >= MIN_FOREIGN_UNITS:
        return True  # Japanese writes kana between its Han words: all Han and no kana is Chinese
    if p_script in _LANG_OF_SCRIPT:
        return False
    p_lang, a_lang = detect(prompt), detect(answer)
    if p_lang is None or a_lang is None:
        return None
    return p_lang != a_lang


def prompt_script(prompt: str) -> str | None:
    """The writing system most of a prompt is in ("han", "latin", "cyrillic", ...), or None under MIN_UNITS:
    what the rollout's answer checks group prompts by, so a canary worse on one language's prompts is seen
    even where it is better on another's."""
    units = dict(_profile(prompt)[1])
    if sum(units.values()) < MIN_UNITS:
        return None
    return max(units, key=lambda s: units[s])
