"""Garbled characters in an answer: code points no healthy text holds, and mojibake (UTF-8 bytes read with
another codec, as a misconfigured tokenizer, server or client does).

Mojibake is found by undoing it: the text is encoded back with each legacy codec (cp1252/latin-1,
cp1250, cp1251, KOI8-R, cp866, ISO 8859-5, Mac Roman, cp437/cp850; GBK, Shift-JIS, EUC-KR), and the
UTF-8 sequences in those bytes that decode to a character UTF-8 text holds are counted, per word, where
they are most of the word's non-ASCII bytes: "cafÃ©" is "café", "â€™" is "’", "Ð¿Ñ€Ð¸" is "при".
Healthy French, Russian or Chinese text encodes to bytes that are almost never valid UTF-8, so it is not
flagged; a regex of the codecs' lead and continuation characters side by side skips most texts at once.
A codec that drops bytes (errors ignored) leaves no sequence to decode; its Chinese and Japanese
mojibake is a text of rare Han characters instead ("浣犲ソ" for "你好"): the share of Han characters
outside the common levels of GB2312, Big5 and JIS X 0208 (3,755, 5,401 and 2,965 characters that
carry almost all running text) is the second signal, and Hangul or half-width kana inside other CJK
words (EUC-KR's and Shift-JIS's readings) the third.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import NamedTuple

RARE_HAN_SHARE = 0.2  # this share of an answer's Han characters outside the common levels ...
RARE_HAN_MIN = 6  # ... with at least this many of them, is mojibake
SCRIPT_CLASHES = 4  # Hangul or half-width kana letters written into other CJK words (no space between)
WORD_SHARE = 0.75  # a word is mojibake when decoded sequences are this share of its non-ASCII bytes ...
MANY_SEQUENCES = 6  # ... or, read with a one-byte codec, holds this many (a codec that dropped bytes)

STACKS = 2  # letters carrying 3+ combining diacritics ("zalgo" text): Vietnamese stacks 2 at most
_STACKED = re.compile("[\u0300-\u036f\u0483-\u0489\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]{3,}")
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Python's Unicode database lags the models': newer emoji and CJK extensions read as unassigned there
_NEWER_THAN_PYTHON = ((0x1F000, 0x1FAFF), (0x20000, 0x3FFFF))


@lru_cache(maxsize=16384)
def category(ch: str) -> str:
    return unicodedata.category(ch)


@lru_cache(maxsize=16384)
def _bad(ch: str) -> str | None:
    """What kind of code point no healthy text holds ``ch`` is, or None (a cache: a text has a few hundred)."""
    cat, cp = category(ch), ord(ch)
    if ch == "\ufffd":
        return "replacement characters"
    if cat == "Cc":
        return None if ch in "\n\t\r" else "control characters"
    if cat in ("Co", "Cs"):
        return "private-use characters" if cat == "Co" else "lone surrogates"
    if cat == "Cn" and not any(lo <= cp <= hi for lo, hi in _NEWER_THAN_PYTHON):
        return "unassigned code points"
    return None


def bad_characters(text: str) -> str | None:
    """U+FFFD, control characters other than tab and newlines, private-use, surrogate and unassigned code
    points, counted ("replacement characters: 3"), and diacritics stacked 3+ on one letter ("Z̷̢͝a̸"); None
    when there are none."""
    if text.isascii():
        n = len(_CONTROLS.findall(text))
        return f"control characters: {n}" if n else None
    counts: Counter[str] = Counter()
    chars = list(set(text))
    kinds = list(map(_bad, chars))  # map: the cached lookups run in C
    if any(kinds):
        for ch, what in zip(chars, kinds, strict=True):
            if what:
                counts[what] += text.count(ch)
    if len(stacks := _STACKED.findall(text)) >= STACKS:
        counts["letters with stacked diacritics"] = len(stacks)
    return ", ".join(f"{what}: {n}" for what, n in counts.most_common()) or None


def _cp1252_to_latin1() -> dict[int, int]:
    """cp1252's 0x80-0x9F characters to those bytes (as latin-1 code points), U+FFFD to a continuation byte:
    text decoded with either codec (errors replaced) encodes back to its bytes through latin-1."""
    table = {0xFFFD: 0x81}
    for b in range(0x80, 0xA0):
        ch = bytes([b]).decode("cp1252", "ignore")
        if ch:
            table[ord(ch)] = b
    return table


_LATIN1 = _cp1252_to_latin1()
_UTF8_SEQ = re.compile(rb"[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3}")
_HIGH_BYTES = bytes(range(0x80, 0x100))
Ranges = tuple[tuple[int, int], ...]
_LATIN: Ranges = ((0xA0, 0x24F),)
_LATIN_LETTERS: Ranges = ((0xC0, 0x17F),)  # where the codec's lead bytes are punctuation ("»Über" is no "Ȇber")
_NON_LATIN: Ranges = ((0x370, 0x52F), (0x590, 0x6FF))  # Greek, Cyrillic, Hebrew, Arabic
_PUNCTUATION: Ranges = ((0x2000, 0x206F), (0x20AC, 0x20AC), (0x2116, 0x2122))  # ’ “ — … € № ™
_EMOJI: Ranges = ((0x2600, 0x27BF), (0x1F000, 0x1FAFF))
_WIDE: Ranges = ((0x900, 0x3FFFF),)  # every script from Devanagari on, CJK and emoji included


class Codec(NamedTuple):
    name: str
    encode: Callable[[str], bytes]  # text that was decoded with this codec, back to its bytes
    hides: Ranges  # the characters that UTF-8 text read with it is seen to hide (the rest: chance)
    per_word: int  # sequences a word needs: a multi-byte codec's healthy text holds one by chance
    alone: bytes = b""  # lead bytes whose one sequence is evidence enough


def _encoder(name: str) -> Callable[[str], bytes]:
    return lambda text: text.encode(name, "replace")


# Cyrillic codecs put lowercase letters on lead bytes and others on continuation bytes: healthy Russian
# read back through cp866 holds "хво" = U+58AE, so they are trusted with letters and punctuation only.
ONE_BYTE = (
    Codec("cp1252", lambda text: text.translate(_LATIN1).encode("latin-1", "replace"), _LATIN + _NON_LATIN + _WIDE,
          1, b"\xc2\xc3\xd0\xd1"),  # "Ã©", "Â£", "Ð¿": never in healthy text
    Codec("cp1250", _encoder("cp1250"), _LATIN + _NON_LATIN + _WIDE, 1),
    *(Codec(name, _encoder(name), _NON_LATIN + _PUNCTUATION + _EMOJI, 1)
      for name in ("cp1251", "koi8_r", "cp866", "iso8859_5")),
    *(Codec(name, _encoder(name), _LATIN_LETTERS + _PUNCTUATION + _EMOJI, 1)
      for name in ("mac_roman", "cp437", "cp850")),
)
MULTI_BYTE = tuple(Codec(name, _encoder(name), _WIDE, 3) for name in ("gbk", "cp932", "cp949"))


def _byte_classes(name: str) -> tuple[frozenset[str], frozenset[str]]:
    """The characters a one-byte codec reads from UTF-8 lead bytes, and from continuation bytes."""
    reads = ("cp1252", "latin-1") if name == "cp1252" else (name,)  # cp1252 stands for latin-1 too
    leads = {bytes([b]).decode(r, "ignore") for r in reads for b in range(0xC2, 0xF5)}
    continuations = {bytes([b]).decode(r, "ignore") for r in reads for b in range(0x80, 0xC0)} | {"\ufffd"}
    return frozenset(leads - {""}), frozenset(continuations - {""})


def _class(chars: Iterable[str]) -> str:
    return f"[{re.escape(''.join(sorted(chars)))}]"


def _pair(name: str) -> re.Pattern[str]:
    """Two characters in a row that the codec reads from a UTF-8 lead byte and a continuation byte: where a
    text has none, encoding it back finds no sequence (the common case, settled by one regex scan)."""
    leads, continuations = _byte_classes(name)
    return re.compile(_class(leads) + _class(continuations))


_PAIRS = {c.name: _pair(c.name) for c in ONE_BYTE}
_ANY_PAIR = re.compile(_class(set().union(*(_byte_classes(c.name)[0] for c in ONE_BYTE)))
                       + _class(set().union(*(_byte_classes(c.name)[1] for c in ONE_BYTE))))  # one scan, most texts


@lru_cache(maxsize=8192)
def _plausible(seq: bytes, hides: Ranges) -> str | None:
    """The character a UTF-8 sequence decodes to, where ``hides`` holds it and it is a letter, digit,
    punctuation or symbol (what UTF-8 text holds); None for the rest (chance)."""
    ch = seq.decode("utf-8", "replace")
    if len(ch) != 1:
        return None  # an overlong form or a surrogate: no UTF-8 encoder wrote it
    cp = ord(ch)
    if not any(lo <= cp <= hi for lo, hi in hides) or 0x800 <= cp <= 0x8FF or cp == 0xFFFD:
        return None
    return ch if 0x1F000 <= cp <= 0x1FAFF or category(ch)[0] in "LNPS" else None  # Python lacks newer emoji


def _enough(codec: Codec, seqs: Iterable[bytes]) -> bool:
    n = 0
    for s in seqs:
        if len(s) > 2 or s[0] in codec.alone:
            return True
        n += 1
    return n >= 2


def _sequences(codec: Codec, text: str) -> Counter[tuple[bytes, str]]:
    """The decoded UTF-8 sequences (bytes, character) in the words of ``text`` that ``codec`` garbled."""
    found: Counter[tuple[bytes, str]] = Counter()
    raw = codec.encode(text)
    if not _enough(codec, (s for s in _UTF8_SEQ.findall(raw) if _plausible(s, codec.hides))):
        return found  # the common case: a few sequences by chance, or none
    for word in raw.split():
        seqs = [(s, ch) for s in _UTF8_SEQ.findall(word) if (ch := _plausible(s, codec.hides))]
        high = len(word) - len(word.translate(None, _HIGH_BYTES))
        if len(seqs) >= codec.per_word and sum(len(s) for s, _ in seqs) >= WORD_SHARE * high \
                or codec.per_word == 1 and len(seqs) >= MANY_SEQUENCES:
            found.update(seqs)
    return found


_HAN_RANGES = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF))
_HAN = re.compile("[" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in _HAN_RANGES) + "]")
_COMMON_LEVELS = (("gb2312", 0xB0, 0xD7), ("big5", 0xA4, 0xC6), ("euc_jp", 0xB0, 0xCF))  # lead bytes of level 1


@lru_cache(maxsize=32768)
def common_han(ch: str) -> bool:
    """In the first (frequent) level of GB2312, Big5 or JIS X 0208."""
    for name, lo, hi in _COMMON_LEVELS:
        try:
            lead = ch.encode(name)[0]
        except UnicodeEncodeError:
            continue
        if lo <= lead <= hi:
            return True
    return False


_HANGUL_OR_HALF_KANA = re.compile("[\uac00-\ud7af\uff66-\uff9f]")
_WIDE_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"  # kana, Han, Hangul
_CLASH = re.compile("[\uac00-\ud7af](?=[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uff66-\uff9f])"
                    "|[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uff66-\uff9f](?=[\uac00-\ud7af])"
                    f"|[\uff66-\uff9f](?=[{_WIDE_CJK}])|[{_WIDE_CJK}](?=[\uff66-\uff9f])")


def _script_clash(text: str) -> str | None:
    """Korean does not write Hangul into Han or kana words ("한국어(韓國語)"), nor Japanese half-width kana
    into Han or full-width kana words: EUC-KR's and Shift-JIS's readings of UTF-8 do, all over
    ("訝ゆ백℡ζ竊腰", "ｹｹ俯株")."""
    if not _HANGUL_OR_HALF_KANA.search(text):
        return None
    clashes = _CLASH.findall(text)
    return f"mojibake: {len(clashes)} Hangul or half-width kana letters written into other CJK words" \
        if len(clashes) >= SCRIPT_CLASHES else None


def _evidence(codec: Codec, text: str) -> str | None:
    found = _sequences(codec, text)
    if not _enough(codec, (s for s, _ in found.elements())):
        return None
    (seq, ch), n = found.most_common(1)[0]
    shown = seq.decode("latin-1").translate({b: c for c, b in _LATIN1.items()}) if codec.name == "cp1252" \
        else seq.decode(codec.name, "replace")
    total = found.total()
    return f"mojibake ({codec.name}): {shown!r} x{n} (was {ch!r})" + (f", {total} in all" if total > n else "")


def mojibake(text: str) -> str | None:
    """Evidence of mojibake ("mojibake (cp1252): 'Ã©' x4 (was 'é'), 9 in all"), or None."""
    if text.isascii():
        return None
    if _ANY_PAIR.search(text):
        for codec in ONE_BYTE:
            if _PAIRS[codec.name].search(text) and (found := _evidence(codec, text)):
                return found
    han = Counter(_HAN.findall(text))
    rare = sum(n for ch, n in han.items() if not common_han(ch))
    if rare >= RARE_HAN_MIN and rare >= RARE_HAN_SHARE * han.total():
        # GBK, Shift-JIS and EUC-KR readings of UTF-8 are mostly rare Han: name the codec where it shows
        found = next(filter(None, (_evidence(codec, text) for codec in MULTI_BYTE)), None)
        shown = "".join(ch for ch, _ in han.most_common() if not common_han(ch))[:6]
        return found or f"mojibake: {rare} of {han.total()} Han characters are rare ones ({shown!r}...)"
    return _script_clash(text) if han else None
