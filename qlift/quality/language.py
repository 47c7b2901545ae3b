"""The language of an answer against the language of the prompt it answers.

Two steps, cheapest first: the writing system (Han, kana, Hangul, Cyrillic, Arabic, Latin ...),
counted in units (a CJK character or a word of any other script, so "iPhone" in a Chinese answer
is one unit, not six letters); then, within one script, py3langid (its model ships inside its
wheel: nothing is downloaded) on texts long enough for it.

Only the answer's own prose is judged (``own_prose``). Code, URLs, formulas and JSON structure are not
language (a JSON answer is judged on its string values), and quoted text is not the answer's own: a
markdown block quote, a span in quotes of any script (「」 『』 “” ‘’ «» „“ "" ...), a short parenthesis
holding a term, and every run of 3+ tokens (6+ CJK characters) that the user's message holds verbatim,
quoted or not (the user's English error message, a path, a product name, quoted back in a Chinese
answer). Nor is a name or a technical term inside the prompt's language: a run of another script counts
only where it reads as language (below), so "用 Docker Compose 部署" is Chinese; an answer mostly in
another script is off all the same.

A share catches an answer that drifted; a code switch is one clause of another language inside an
answer in the right one ("Your refund is processed, 请耐心等待三到五个工作日, and ..."), under any
share. It is a run of SWITCH_UNITS+ consecutive units of another script that reads as language,
not as a name: a Han run holds a function character (的, 了, 请 ...; a city, an address or a brand
has none), a Latin run holds function words ("iPhone 15 Pro Max" has none).

The prompt's language is its own prose's too. A Chinese question around a pasted English error allows a
Chinese answer even where the English has more words, and a prompt that names a language ("翻译成英文",
"answer in Spanish") allows that language's script.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from functools import lru_cache
from operator import itemgetter
from typing import Any, NamedTuple

from qlift.quality.schema import parse_json_output
from qlift.quality.text import CJK, span_tokens, token_spans, tokens

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
_CJK_CHAR = re.compile(rf"[{CJK}]")
_ASCII_LETTERS = str.maketrans({chr(c): chr(c) if chr(c).isalpha() else " " for c in range(128)})  # _UNITS on ASCII
_ENGLISH_WORD = re.compile(r"[A-Za-z']+")
_ENGLISH_LETTERS = str.maketrans({chr(c): chr(c).lower() if chr(c).isalpha() or chr(c) == "'" else " "
                                  for c in range(128)})  # _ENGLISH_WORD on ASCII, lowercased
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


_JSON_STARTS = frozenset('{["-0123456789tfnNI`')  # what json.loads can start at (a fence: `)


@lru_cache(maxsize=8192)
def json_value(text: str) -> tuple[bool, Any]:
    """``schema.parse_json_output``, remembered (half the answer checks ask whether an answer is JSON; the value
    is shared: read it, never change it), and answered at once for a text whose first character can open no
    JSON (nor a markdown fence): most prose fails on its first letter, but only after a raised error."""
    return parse_json_output(text) if text.lstrip()[:1] in _JSON_STARTS else (False, None)


@lru_cache(maxsize=8192)
def prose(text: str) -> str:
    """The natural-language part of an answer: JSON string values, no code, no URLs (remembered: the language
    and text-shape checks both read it)."""
    ok, value = json_value(text)
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
    per distinct first character, not per unit: a long answer has thousands of units and a few hundred.
    Remembered (the language and engagement checks count an answer's): each caller gets its own dict."""
    return dict(_script_units(text))


@lru_cache(maxsize=8192)
def _script_units(text: str) -> tuple[tuple[str, int], ...]:
    if text.isascii():  # every unit is a run of Latin letters
        n = len(text.translate(_ASCII_LETTERS).split())
        return (("latin", n),) if n else ()
    counts: dict[str, int] = {}
    for ch, n in Counter(map(itemgetter(0), _UNITS.findall(text))).items():
        s = _script(ch)
        counts[s] = counts.get(s, 0) + n
    return tuple(counts.items())


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
    return _language(_profile(text)[0])


@lru_cache(maxsize=8192)
def _language(body: str) -> str | None:
    """``detect`` on prose already taken out of its text (``prose``, ``own_prose``); remembered (a prompt's is
    read for both versions)."""
    units = script_units(body)
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
    # ASCII: the words are the runs of letters and apostrophes, lowercased and split in one translation
    words = text.translate(_ENGLISH_LETTERS).split() if text.isascii() else \
        list(map(str.lower, _ENGLISH_WORD.findall(text)))
    return bool(words) and sum(map(_ENGLISH.__contains__, words)) / len(words) >= 0.2


# Function characters and words: a run of another script holding them reads as language, one without them
# is a name or a term ("Docker Compose", "上海", "Samsung Galaxy S24 Ultra"). Latin's are English's and
# those of the big Latin-script languages, so a drift into Spanish or German reads as language too.
_HAN_FUNCTION = frozenset("的了是我您你请們们吗呢这這那会會将將已把被在么麼怎有和也都就个個为為")
_LATIN_WORDS = (
    "been had were would should could there they he she them his her its who which when where about into than "
    "then so but or as no am "
    "de la el los las en y que un una por para con es del al lo se su le les des et est une pour dans qui pas "
    "du au ce il elle nous vous sont die der das und ist nicht ein eine mit für zu von den dem auf sich ich "
    "não em com os da do uma il che di per non sono")
_LATIN_FUNCTION = _ENGLISH | frozenset(_LATIN_WORDS.split())


def _reads_as_language(script: str, units: list[str]) -> bool:
    if script == "han":
        return any(u in _HAN_FUNCTION for u in units)
    if script == "latin":
        return sum(u.lower() in _LATIN_FUNCTION for u in units) >= 2
    if script in ("kana", "hangul", "thai"):
        return len(units) >= 2
    return sum(len(u) > 1 for u in units) >= 2  # single letters (α, β, π in a formula) are symbols


_SCRIPT_CODE = {s: chr(ord("A") + i) for i, s in enumerate(sorted({*_SCRIPT_OF_NAME.values(), "other"}))}
_RUN = re.compile(r"([^.])\1*")  # units of one script outside ``allowed``, as many as follow each other


def foreign_runs(allowed: frozenset[str], body: str) -> list[int]:
    """The lengths of the runs of units of a script outside ``allowed`` that read as language (``body`` is
    prose without its quotes: ``own_prose``). The units are written as one letter each, their script's ("."
    where allowed), and one regex finds the runs in that string: no Python step per unit."""
    units = _UNITS.findall(body)
    firsts = list(map(itemgetter(0), units))
    code = {ch: "." if (s := _script(ch)) in allowed else _SCRIPT_CODE[s] for ch in set(firsts)}
    runs = (run.span() for run in _RUN.finditer("".join(map(code.__getitem__, firsts))))
    return [last - first for first, last in runs if _reads_as_language(_script(firsts[first]), units[first:last])]


# Quoted, code and formula text is not the answer's own language: a markdown block quote (the user's error
# message quoted back), a span in quotes of any script, a formula, a short parenthesis (a term or a gloss:
# "过拟合（overfitting）"). ASCII quotes count as quotes only where a word does not touch them (don't, it's).
_BLOCK_QUOTE = re.compile(r"^[ \t]*>.*$", re.MULTILINE)
_MATH = re.compile(r"\$\$.+?\$\$|\\\[.+?\\\]|\\\(.+?\\\)|(?<![\w$\\])\$(?=\S)[^$\n]+?(?<=\S)\$(?![\w$])", re.DOTALL)
_PAIRS = ("「」", "『』", "“”", "‘’", "«»", "‹›", "„“", "„”", "《》", "〈〉", "＂＂", '""')
# The ASCII quote's word check comes after it ('(?<!\w') rather than before it: every branch then opens with a
# quote character, and re skips from one to the next instead of trying each branch at every character (6x).
_QUOTED = re.compile("|".join(f"{re.escape(p[0])}[^{re.escape(p)}\\n]{{1,400}}{re.escape(p[1])}" for p in _PAIRS)
                     + r"|'(?<!\w')[^'\n]{1,400}'(?!\w)")
_PARENTHESIS = re.compile(r"[(（]([^()（）\n]{1,80})[)）]")
TERM_UNITS = 5  # a parenthesis of at most this many units holds a term, not a clause
COPY_TOKENS = 3  # a run of this many tokens of the user's message, verbatim, is the user's text quoted back
COPY_CJK = 6  # ... and of this many CJK characters (a few are a shared word, not a quotation)


def _is_cjk(token: str) -> bool:
    return _CJK_CHAR.match(token) is not None


@lru_cache(maxsize=1024)
def _token_scripts(prompt: str) -> frozenset[str]:
    """The scripts of the prompt's tokens (remembered: a prompt is judged for both versions)."""
    return frozenset(_script(t[0]) for t in set(tokens(prompt)))


@lru_cache(maxsize=1024)
def _grams(prompt: str) -> dict[int, frozenset[tuple[str, ...]]]:
    """The prompt's runs of COPY_TOKENS tokens (not all CJK) and of COPY_CJK tokens (remembered)."""
    asked = tokens(prompt)
    grams = {n: frozenset(zip(*(asked[i:] for i in range(n)), strict=False)) for n in (COPY_TOKENS, COPY_CJK)}
    grams[COPY_TOKENS] = frozenset(g for g in grams[COPY_TOKENS] if not all(map(_is_cjk, g)))  # CJK: COPY_CJK
    return grams


def without_copies(prompt: str, body: str, allowed: frozenset[str]) -> str:
    """``body`` without the runs of COPY_TOKENS+ tokens (COPY_CJK+ if all CJK) that the prompt holds verbatim:
    an error message, a path or a product name copied from the user's message, quoted or not. Only their
    tokens of scripts outside ``allowed`` go: a copy in the answer's own language is its language."""
    if _token_scripts(prompt) <= allowed or not (grams := _grams(prompt))[COPY_TOKENS]:
        return body  # the prompt holds nothing that could count as another language
    toks = span_tokens(body)
    if all(seen.isdisjoint(zip(*(toks[i:] for i in range(n)), strict=False)) for n, seen in grams.items()):
        return body  # nothing copied: no offsets needed
    spans = token_spans(body)
    copied = [False] * len(toks)
    for n, seen in grams.items():
        if seen.isdisjoint(zip(*(toks[i:] for i in range(n)), strict=False)):
            continue
        for i, gram in enumerate(zip(*(toks[i:] for i in range(n)), strict=False)):
            if gram in seen:
                copied[i:i + n] = [True] * n
    if not any(copied):
        return body
    out, at = [], 0
    for (tok, start, end), hit in zip(spans, copied, strict=True):
        if hit and _script(tok[0]) not in allowed:
            out.append(body[at:start] + " ")
            at = end
    return "".join(out) + body[at:]


def unquoted(text: str) -> str:
    """``text`` without its markdown block quotes and its spans in quotes (of any script): words that the
    answer quotes, not says."""
    if ">" in text:
        text = _BLOCK_QUOTE.sub(" ", text)
    return _QUOTED.sub(" ", text)


@lru_cache(maxsize=8192)
def own_prose(text: str) -> str:
    """The text's own prose: ``prose`` without block quotes, quoted spans, formulas and short parentheses,
    NFC-normalised."""
    body = prose(text)
    if not unicodedata.is_normalized("NFC", body):
        body = unicodedata.normalize("NFC", body)
    if "$" in body or "\\" in body:
        body = _MATH.sub(" ", body)
    body = unquoted(body)
    body = _PARENTHESIS.sub(lambda m: " " if len(_UNITS.findall(m[1])) <= TERM_UNITS else m[0], body)
    return body


# A prompt that names a language allows its script: "翻译成英文", "answer in Spanish", "英語で書いて".
_NAMED = {
    "latin": r"english|spanish|french|german|portuguese|italian|英文|英语|英語|영어|английск|الإنجليزية|ingl[eé]s"
             r"|espa[ñn]ol|西班牙|法语|法語|德语|德語|anglais|englisch|fran[cç]ais",
    "han": r"chinese|mandarin|中文|汉语|漢語|华语|中国語|중국어|китайск|الصينية|chino",
    "kana": r"japanese|日语|日文|日本語|일본어|японск|اليابانية|japon[eé]s",
    "hangul": r"korean|韩语|韓語|韩文|韓国語|한국어|корейск|الكورية|coreano",
    "cyrillic": r"russian|ukrainian|俄语|俄文|ロシア語|러시아어|русск|украинск|الروسية|ruso",
    "arabic": r"arabic|阿拉伯|アラビア語|아랍어|арабск|العربية|[aá]rabe",
}
_NAMED_LANGUAGE = {script: re.compile(pattern, re.IGNORECASE) for script, pattern in _NAMED.items()}
MIXED_SHARE = 0.25  # Latin prose of this share of a mostly non-Latin prompt's words is the user's too (an email)
_WORD_SIZE = {"han": 0.5, "kana": 0.5}  # a CJK character is about half a word


def _quoted_scripts(prompt: str) -> frozenset[str]:
    """The scripts of what the prompt quotes ("「serendipity」の意味は？", "What does “一路顺风” mean?"): an
    answer about quoted words may give examples in their language, though it is written in the prompt's."""
    body = prose(prompt)
    quoted = " ".join(m[0] for m in _QUOTED.finditer(body))
    if ">" in body:
        quoted += " ".join(m[0] for m in _BLOCK_QUOTE.finditer(body))
    return frozenset(script_units(quoted))


def _allowed(prompt_body: str, units: dict[str, int], named: set[str]) -> frozenset[str]:
    """The scripts an answer to this prompt may be written in: the prompt's main one, every other one it
    writes as language (a Chinese question around an English error message allows Chinese; Latin only from
    MIXED_SHARE of the prompt: English is what people paste), and those of the languages it ``named``."""
    main = max(units, key=lambda s: units[s])
    words = sum(n * _WORD_SIZE.get(s, 1) for s, n in units.items())
    found = _UNITS.findall(prompt_body)
    mixed = {s for s, n in units.items() if s != main and n >= MIN_UNITS and (s != "latin" or n >= MIXED_SHARE * words)
             and _reads_as_language(s, [u for u in found if _script(u[0]) == s])}
    allowed = {main, "other", *mixed, *named}
    if units.get("kana") or "kana" in named:
        allowed |= {"han", "kana"}  # Japanese writes Han and kana
    return frozenset(allowed)


class _Asked(NamedTuple):
    """What off_language reads of a prompt (its own prose, units per script, main script, the scripts an answer
    may be written in and may quote examples in, whether it names a language): read once a prompt."""
    body: str
    units: dict[str, int]
    script: str
    allowed: frozenset[str]
    examples: frozenset[str]
    names_language: bool


@lru_cache(maxsize=4096)
def _asked(prompt: str) -> _Asked | None:
    body = own_prose(prompt)
    units = script_units(body)
    if sum(units.values()) < MIN_UNITS:
        return None
    named = {s for s, pattern in _NAMED_LANGUAGE.items() if pattern.search(body)}
    allowed = _allowed(body, units, named)
    return _Asked(body, units, max(units, key=lambda s: units[s]), allowed, allowed | _quoted_scripts(prompt),
                  bool(named))


def off_language(prompt: str, answer: str) -> bool | None:
    """True when the answer's own prose (``own_prose``, ``without_copies``: no quotes, code, formulas or text
    copied from the prompt) is, or switches to, another language than the prompt's; None when either side has
    too little text to tell (a JSON answer of ids and numbers, a one-word prompt)."""
    asked = _asked(prompt)
    if asked is None:
        return None
    allowed, examples = asked.allowed, asked.examples
    body = without_copies(prompt, own_prose(answer), allowed)
    a_units = script_units(body)
    total = sum(a_units.values())
    if total < MIN_UNITS:
        return None
    runs = foreign_runs(examples, body) if any(s not in examples for s in a_units) else []
    foreign = sum(runs)  # units of other languages: names and terms are not
    if foreign >= MIN_FOREIGN_UNITS and foreign / total >= FOREIGN_SHARE:
        return True
    if any(n >= SWITCH_UNITS for n in runs):
        return True  # a code switch
    outside = sum(n for s, n in a_units.items() if s not in allowed)
    if outside >= MIN_FOREIGN_UNITS and 2 * outside > total:
        return True  # names and terms are excused inside prose of the prompt's language, not instead of it
    p_script = asked.script
    if p_script == "kana" and not a_units.get("kana") and a_units.get("han", 0) >= MIN_FOREIGN_UNITS:
        return True  # Japanese writes kana between its Han words: all Han and no kana is Chinese
    a_script = max(a_units, key=lambda s: a_units[s])
    if p_script in _LANG_OF_SCRIPT or (a_script != p_script and a_script in allowed) or asked.names_language:
        return False  # told by the script; or mostly in another script the prompt writes; or a language named
    if json_value(answer.strip())[0]:
        return None  # one script: a JSON answer's values (names, enums) are too few words for langid to tell
    p_lang, a_lang = _language(asked.body), _language(body)
    if p_lang is None or a_lang is None:
        return None
    return p_lang != a_lang


@lru_cache(maxsize=8192)
def prompt_script(prompt: str) -> str | None:
    """The writing system most of a prompt is in ("han", "latin", "cyrillic", ...), or None under MIN_UNITS:
    what the rollout's answer checks group prompts by, so a canary worse on one language's prompts is seen
    even where it is better on another's."""
    units = dict(_profile(prompt)[1])
    if sum(units.values()) < MIN_UNITS:
        return None
    return max(units, key=lambda s: units[s])
