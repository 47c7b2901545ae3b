"""The language of an answer against the language of the prompt it answers.

Two steps, cheapest first: the writing system (Han, kana, Hangul, Cyrillic, Arabic, Latin ...),
counted in units (a CJK character or a word of any other script, so "iPhone" in a Chinese answer
is one unit, not six letters); then, within one script, py3langid (its model ships inside its
wheel: nothing is downloaded) on texts long enough for it. Code blocks, inline code, URLs and
JSON structure are not language: a JSON answer is judged on its string values.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any

from qlift.quality.repetition import CJK

MIN_UNITS = 4  # fewer units of text: no language to tell
MIN_LANGID_LETTERS = 40  # py3langid within one script only above about this many letters
LANGID_CHARS = 600  # the opening py3langid reads: enough to tell, and its cost grows with the text
FOREIGN_SHARE = 0.3  # an answer with this share of its units in another script drifted ...
MIN_FOREIGN_UNITS = 6  # ... if there are at least this many of them

_CODE = re.compile(r"```.*?(```|$)|`[^`\n]*`", re.DOTALL)
_URL = re.compile(r"\bhttps?://\S+|\b[\w.+-]+@[\w-]+\.[\w.-]+")
_UNITS = re.compile(rf"[{CJK}]|[^\W\d_{CJK}]+")  # a CJK character, or a run of other letters
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
    return _URL.sub(" ", _CODE.sub(" ", text))


@lru_cache(maxsize=4096)
def _script(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return _SCRIPT_OF_NAME.get(name.split(" ", 1)[0], "other")


def script_units(text: str) -> dict[str, int]:
    """Units of text per script."""
    counts: dict[str, int] = {}
    for unit in _UNITS.findall(text):
        s = _script(unit[0])
        counts[s] = counts.get(s, 0) + 1
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
    if script == "latin" and _looks_english(body):
        return "en"  # the stopword test settles most English at a fraction of py3langid's cost
    if script == "latin" and units[script] * 5 < MIN_LANGID_LETTERS:
        return None
    lang, _ = _langid().classify(body[:LANGID_CHARS])
    return None if lang == "zxx" else str(lang)


_ENGLISH = frozenset({"the", "a", "an", "is", "are", "was", "be", "to", "of", "and", "in", "on", "for", "it", "that",
                      "this", "with", "you", "your", "i", "we", "not", "can", "please", "thanks", "order", "at",
                      "have", "has", "will", "my", "our", "if", "by", "from", "what", "how", "do", "does"})


def _looks_english(text: str) -> bool:
    words = [w.lower() for w in re.findall(r"[A-Za-z']+", text)]
    return bool(words) and sum(w in _ENGLISH for w in words) / len(words) >= 0.2


def off_language(prompt: str, answer: str) -> bool | None:
    """True when the answer is (partly) in another language than the prompt; None when either side has
    too little text to tell (a JSON answer of ids and numbers, a one-word prompt)."""
    p_units, a_units = dict(_profile(prompt)[1]), dict(_profile(answer)[1])
    if sum(p_units.values()) < MIN_UNITS or sum(a_units.values()) < MIN_UNITS:
        return None
    p_script = max(p_units, key=lambda s: p_units[s])
    foreign = sum(n for s, n in a_units.items() if s != p_script and s != "other")
    if foreign >= MIN_FOREIGN_UNITS and foreign / sum(a_units.values()) >= FOREIGN_SHARE:
        return True
    if p_script in _LANG_OF_SCRIPT:
        return False
    p_lang, a_lang = detect(prompt), detect(answer)
    if p_lang is None or a_lang is None:
        return None
    return p_lang != a_lang
