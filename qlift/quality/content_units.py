"""Content units: what of a text names its subject, for the engagement check (qlift.quality.engagement).

Content is what is left of a text without its function words (data/function_words.txt: 15 languages, with the
words of asking, small talk and form: "explain", "something else", "poem"), each unit weighted by its length (a
long word is a rarer one). A unit per script, so that a word's forms are one unit:

- Latin, Greek, Cyrillic: a word cut to its first 5 letters, accents folded ("refund", "refunds", "refunded");
  a shorter word is also found in words of up to 6 letters that start with it, or with it less a final vowel
  or s ("side" in "sides", "небо" in "неба", "alta" in "altura");
- Arabic: a word without its article (and a proclitic before it), a conjunction و, a common suffix and a verb's
  person prefix, letters normalised (light stemming: "أحتاج" and "تحتاجه" are one unit); a first ب ل ك ف is
  tried both ways ("لرحلة" and "الرحلات");
- Han: character pairs within runs cut at function words (and, outside Japanese, where kana bound the words
  already, at Chinese function characters: 的, 了, 是 ...; "京都" keeps its 都); a pair the other text holds
  as separate characters counts too ("睡眠" in "睡前 ... 失眠"), half where one of them is a one-character
  word there ("考试" in "没考好"; a word stands for one pair);
- kana: a katakana word whole; a hiragana run less its particles and polite endings ("でおすすめの" is
  "おすすめ"), found anywhere in the other text's hiragana; a run right after a Han character is that
  word's ending (okurigana: 行きます), not a word;
- Hangul: a word's first two syllables;
- numbers and identifiers as written, digit groups joined ("7.000", "7,000" and "7000" are one unit).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import chain, repeat
from operator import itemgetter
from pathlib import Path

from qlift.quality.language import script_units
from qlift.quality.text import tokens

FUNCTION_WORDS = Path(__file__).parent / "data" / "function_words.txt"
STEM = 5  # letters a Latin, Greek or Cyrillic word is cut to
PAIR_WEIGHT, SINGLE_WEIGHT, MIN_WORD_WEIGHT, MAX_WORD_WEIGHT = 4, 2, 4, 10
CJK_PER_WORD = 1.5  # CJK characters to a word, for a text's length
JAPANESE_KANA = 0.1  # share of a text's CJK characters in hiragana that makes it Japanese (a kaomoji's っ does not)
MIN_KANA_WORD = 3  # hiragana in a word, at least
MAX_FORM = 6  # letters of a word that is a short word's form ("alta", "altura")

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_RUN = re.compile(rf"([{_HAN}]+|[\u30a0-\u30ff]+|[\uac00-\ud7af]+|[\u3040-\u309f]+)")  # split keeps runs
_PARTICLES = "はがをにでともへやかねよの"
_LEADING_PARTICLES = re.compile(f"^[{_PARTICLES}]+")
_TRAILING_GRAMMAR = re.compile(f"(?:[{_PARTICLES}な]|です|ます|ました|ません|ください)*[おご]?$")  # お, ご: honorifics
# auxiliary verbs, their conjugations and formal nouns: a run that holds one is grammar, not a word
_KANA_GRAMMAR = re.compile("する|して|した|され|させ|いる|ある|あり|あれ|なる|なり|なっ"
                           "|こと|ため|よう|とき|ござい|しま|でき|ない|たい|れば")
_FINALS = frozenset("aeiouyаеёиоуыэюяьйs")  # the final letter a short word's other forms may lack
# 7.000, 7,000, 7'000, 7 000: the separator first (its digit checked behind it), so re scans for the separators
_DIGIT_GROUP = re.compile(r"[.,'\u00a0\u2009\u202f](?<=\d[.,'\u00a0\u2009\u202f])(?=\d{3}(?!\d))")
# Arabic light stemming (after Larkey's light10): normalised letters, then article, proclitic, suffix, prefix
_AR_MARKS = re.compile("[\u0610-\u061a\u064b-\u065f\u0670\u0640]")  # harakat, tatweel
_AR_LETTERS = str.maketrans("أإآٱىة", "اااايه")
_AR_ARTICLES = ("وال", "فال", "بال", "كال", "لل", "ال")
_AR_SUFFIXES = ("ها", "ان", "ات", "ون", "ين", "يه", "ه", "ي")  # ة is ه by now
_AR_PROCLITICS = "بلكف"


def _stemmed(word: str) -> bool:
    """Latin, Greek and Cyrillic words are cut to their first STEM letters; other scripts and numbers are not."""
    return word[0].isalpha() and word[0] < "\u0530"


def _fold(word: str) -> str:
    """A Latin, Greek or Cyrillic word without its accents ("fidèles" and "fidélité" start alike)."""
    if word.isascii() or not _stemmed(word):
        return word
    bare = "".join(c for c in unicodedata.normalize("NFD", word) if not unicodedata.combining(c))
    return unicodedata.normalize("NFC", bare)


def _arabic_stem(word: str) -> str:
    """The word, letters normalised, without its article (with a proclitic before it: وال, بال, لل ...) or a
    conjunction و, a suffix, and a verb's person prefix (أ ت ي ن), each only where 2+ letters stay (3+ after
    و, 4+ after a person prefix)."""
    word = _AR_MARKS.sub("", word).translate(_AR_LETTERS)
    article = next((a for a in _AR_ARTICLES if word.startswith(a) and len(word) - len(a) >= 2), None)
    if article:
        word = word[len(article):]
    elif word[0] == "و" and len(word) >= 4:
        word = word[1:]
    suffix = next((s for s in _AR_SUFFIXES if word.endswith(s) and len(word) - len(s) >= 2), "")
    word = word[:len(word) - len(suffix)]
    return word[1:] if word[0] in "اتين" and len(word) >= 5 else word


def _arabic_alternates(words: set[str]) -> dict[str, str]:
    """The unit of each word that starts with ب ل ك ف, without that letter: a proclitic ("لرحلة": "for a
    trip") or the word's own first letter ("كتاب"), which only the other text can tell."""
    out = {}
    for word in words:
        if word[0] in _AR_PROCLITICS and len(word) >= 4 and (item := _word_item(word)):
            out[item[0]] = _arabic_stem(word[1:])
    return out


def _load() -> tuple[frozenset[str], frozenset[str], dict[str, re.Pattern[str]], dict[str, tuple[str, ...]]]:
    """(function words, the stems of the long ones, what cuts a Han run in Chinese and in Japanese text,
    the languages each word as written is a function word of)."""
    words: set[str] = set()
    chars: dict[str, str] = {}
    langs: dict[str, tuple[str, ...]] = {}
    for line in FUNCTION_WORDS.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        lang, _, listed = line.partition(":")
        if lang.endswith("chars"):
            chars[lang] = "".join(listed.split())
            continue
        for w in map(str.lower, listed.split()):
            words.add(_fold(w))
            langs[w] = (*langs.get(w, ()), lang)
    stems = frozenset(w[:STEM] for w in words if len(w) >= STEM and _stemmed(w))

    def han_words(lang: str | None) -> list[str]:
        return [w for w in words if len(w) > 1 and all("\u3400" <= c <= "\u9fff" for c in w)
                and (lang is None or lang in langs[w])]

    def cut(function_chars: str, han: list[str]) -> re.Pattern[str]:
        han.sort(key=len, reverse=True)
        firsts = "".join(sorted({w[0] for w in han}))  # a lookahead first: most characters fail at once
        return re.compile(f"[{function_chars}]+|(?=[{firsts}])(?:{'|'.join(han)})")

    cuts = {"zh": cut(chars["zh-chars"] + chars["ja-chars"], han_words(None)),
            "ja": cut(chars["ja-chars"], han_words("ja"))}
    return frozenset(words), stems, cuts, langs


_WORDS, _STEMS, _HAN_CUTS, _LANGS = _load()


@lru_cache(maxsize=65536)
def _word_item(word: str) -> tuple[str, int] | None:
    """A word's content unit and weight, or None for a function word, a single letter or digit."""
    weight = min(max(len(word), MIN_WORD_WEIGHT), MAX_WORD_WEIGHT)
    word = _fold(word)
    if len(word) < 2 or word in _WORDS:
        return None
    if _stemmed(word):
        stem = word[:STEM]
        return None if len(word) > STEM and stem in _STEMS else (stem, weight)
    if "\u0600" <= word[0] <= "\u06ff" and len(word) > 2:
        word = _arabic_stem(word)
        return None if len(word) < 2 or word in _WORDS else (word, weight)
    return word, weight


def _kana_word(run: str, after_han: bool, items: dict[str, int]) -> None:
    """A hiragana run's word: the run less the particles before it and the particles and polite endings after
    it ("でおすすめの", "もおすすめです"); none where the run follows a Han character without a particle
    first (the character's ending, okurigana: "行きます", "高さは") or holds an auxiliary ("するため")."""
    word = _LEADING_PARTICLES.sub("", run)
    if after_han and word == run:
        return
    word = _TRAILING_GRAMMAR.sub("", word)
    if len(word) >= MIN_KANA_WORD and word not in _WORDS and not _KANA_GRAMMAR.search(word):
        items[word] = PAIR_WEIGHT


def _cjk_items(run: str, before: str, japanese: bool, items: dict[str, int]) -> None:
    first = run[0]
    if "\u3040" <= first <= "\u309f":
        if japanese:
            _kana_word(run, "\u3400" <= before <= "\u9fff", items)
        return
    if "\u30a0" <= first <= "\u30ff":  # a katakana word
        if len(run.strip("ー")) >= 2 and run not in _WORDS:
            items[run] = PAIR_WEIGHT
        return
    if "\uac00" <= first <= "\ud7af":  # a Hangul word: its first two syllables, before the particles
        if len(run) >= 2 and run[:2] not in _WORDS:
            items[run[:2]] = PAIR_WEIGHT
        return
    for piece in _HAN_CUTS["ja" if japanese else "zh"].split(run):
        if len(piece) == 1 and piece not in _WORDS:
            items[piece] = SINGLE_WEIGHT
        items.update(zip(map("".join, zip(piece, piece[1:], strict=False)), repeat(PAIR_WEIGHT)))


@dataclass(frozen=True)
class Content:
    """A text's content units with their weights; the Han characters of its units and its hiragana (where
    another text's single characters, pairs' characters and hiragana words are found); its length in words,
    its main script ("cjk" for Han and kana, "hangul", "latin" ...) and its distinct words."""

    items: dict[str, int]
    han: frozenset[str]
    kana: str
    words: float
    script: str | None
    vocabulary: tuple[str, ...]  # a tuple: the garbage collector stops tracking it, and it has ~100 words
    alternates: dict[str, str]  # Arabic units and their forms without a first ب ل ك ف

    @cached_property
    def lang(self) -> str | None:
        """The language whose function words the text holds most of (2+, ahead of every other), or None."""
        hits = Counter(chain.from_iterable(_LANGS.get(w, ()) for w in self.vocabulary)).most_common(2)
        if not hits or hits[0][1] < 2 or (len(hits) > 1 and hits[1][1] == hits[0][1]):
            return None
        return hits[0][0]

    def holds(self, item: str, alternate: str | None = None) -> bool:
        """This text holds ``item`` (another text's unit, with its ``alternate`` form); a Han pair also where
        both its characters are found apart ("睡眠" in "睡前 ... 失眠")."""
        if item in self.items:
            return True
        first = item[0]
        if first < "\u0530":
            return len(item) < STEM and self._has_form(item)
        if first <= "\u06ff":
            return item in self._bare or alternate is not None and (alternate in self.items or alternate in self._bare)
        if "\u3040" <= first <= "\u309f":
            return item in self.kana
        if first < "\u3400" or len(item) > 2:
            return False
        return all(c in self.han for c in item)

    def half_of(self, item: str) -> str | None:
        """This text's one-character word that takes up half of ``item``, a Han pair it does not hold: a verb
        for its noun ("考" in "没考好" for "考试")."""
        if len(item) != 2 or not "\u3400" <= item[0] <= "\u9fff":
            return None
        return item[0] if item[0] in self.items else item[1] if item[1] in self.items else None

    def _has_form(self, item: str) -> bool:
        """A short word's unit is found in a word of up to MAX_FORM letters that starts with it, or with it
        less its final vowel or s ("side" in "sides", "небо" in "неба"; not in "небольшой")."""
        return item in self._starts or (len(item) >= 4 and item[-1] in _FINALS and item[:-1] in self._starts)

    @cached_property
    def _bare(self) -> frozenset[str]:
        return frozenset(self.alternates.values())

    @cached_property
    def _starts(self) -> frozenset[str]:
        """The first 3 and 4 letters of its Latin, Greek and Cyrillic words of up to MAX_FORM letters (a
        unit's weight is its word's length from MIN_WORD_WEIGHT on)."""
        short = [u for u, w in self.items.items() if len(u) >= 3 and u[0] < "\u0530" and w <= MAX_FORM]
        return frozenset([u[:3] for u in short] + [u[:4] for u in short])


@lru_cache(maxsize=8192)
def content(text: str) -> Content:
    items: dict[str, int] = {}
    han: frozenset[str] = frozenset()
    kana = ""
    cjk: dict[str, int] = {}  # characters of Han and kana ("cjk"), of Hangul
    if not text.isascii() and len(parts := _RUN.split(text)) > 1:
        runs = parts[1::2]
        hiragana = [r for r in runs if "\u3040" <= r[0] <= "\u309f"]
        kana = "|".join(hiragana)
        japanese = sum(map(len, hiragana)) >= JAPANESE_KANA * sum(map(len, runs))
        for i in range(1, len(parts), 2):  # parts[i - 1]: the text before run parts[i], "" where runs touch
            before = parts[i - 1][-1:] or (parts[i - 2][-1:] if i > 1 else "")
            _cjk_items(parts[i], before, japanese, items)
        han = frozenset(chain.from_iterable(k for k in items if "\u3400" <= k[0] <= "\u9fff"))
        for run in runs:
            kind = "hangul" if "\uac00" <= run[0] <= "\ud7af" else "cjk"
            cjk[kind] = cjk.get(kind, 0) + len(run)
        text = " ".join(parts[::2])
    text = _DIGIT_GROUP.sub("", text)
    words = tokens(text)
    distinct = set(words)
    # each word's unit, the heaviest last: a stem keeps its longest word's weight
    items.update(sorted(filter(None, map(_word_item, distinct)), key=itemgetter(1)))
    units = {**{k: n / CJK_PER_WORD for k, n in cjk.items()}, **script_units(text)}
    main = max(units, key=lambda s: units[s]) if units else None
    length = len(words) + sum(cjk.values()) / CJK_PER_WORD
    alternates = _arabic_alternates(distinct) if "arabic" in units else {}
    return Content(items, han, kana, length, main, tuple(distinct), alternates)
