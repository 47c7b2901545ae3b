"""Refusal pattern files (data/refusals/, one a language, and a user's own) read, folded and compiled.

A pattern file holds one regular expression a line, matched at a clause start (qlift.quality.refusal);
``@name = regex`` names a piece that later lines of the same file use as ``(?&name)``. In the shipped files
``@apology``, ``@contrast`` and ``@greeting`` also mark where a clause starts, and ``@gate`` is a regular
expression that every refusal of the file holds (for most languages a character of its script): the file's
lines are tried only on openings where it is found.

Answers and patterns are compared folded (``fold``): lowercase, accents and Arabic harakat dropped, curly
quotes straight, full-width punctuation plain, so "não posso", "nao posso" and "NÃO POSSO" are one pattern.

The shipped lines are sorted by the character they can start with, and a clause that starts with "n" tries
one alternation of the lines that can start with "n" (and of those that can start anywhere), not of all of
them: re enters every branch of an alternation at every clause (it skips one unentered only when it opens
with a plain letter, not with an optional word), and ~150 lines of 9 Latin-script languages would cost 150
attempts at every clause.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from importlib import import_module
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError

BUILTIN = Path(__file__).parent / "data" / "refusals"
ANCHOR = "^\\W*"
_DEFINITION = re.compile(r"@([a-z_]+)\s*=\s*(.*)")
_REFERENCE = re.compile(r"\(\?&([a-z_]+)\)")
_NON_WORD = re.compile(r"\W*")
_ONE_CLASS = re.compile(r"\[[^\]\[]*\]")


def _folded_letters() -> dict[int, str]:
    """What each character folds to where that differs: accented Latin, Greek and Cyrillic letters to their
    base letter (Vietnamese included), Arabic hamza seats to the bare letter, Devanagari nukta letters to
    theirs, full-width and typographic punctuation to ASCII; combining accents, harakat, the tatweel and the
    nukta to nothing. Kana voicing, Hangul and Devanagari vowel signs are letters there and stay."""
    dropped = {*range(0x300, 0x370), *range(0x64B, 0x660), 0x670, 0x640, 0x93C}
    table: dict[int, str] = dict.fromkeys(dropped, "")
    spans = ((0xA0, 0x250), (0x370, 0x530), (0x600, 0x700), (0x900, 0x980), (0x1E00, 0x2070),
             (0x3000, 0x3001), (0xFB00, 0xFE00), (0xFE70, 0xFF00), (0xFF01, 0xFF5F))
    for start, stop in spans:
        for cp in range(start, stop):
            plain = "".join(c for c in unicodedata.normalize("NFKD", chr(cp)) if ord(c) not in dropped)
            if cp not in dropped and plain != chr(cp):
                table[cp] = plain
    table.update({ord(k): v for k, v in {"’": "'", "‘": "'", "‚": "'", "‛": "'", "ʼ": "'", "´": "'", "`": "'",
                                          "“": '"', "”": '"', "„": '"', "‟": '"', "ı": "i", "đ": "d", "Đ": "d",
                                          "ى": "ي", "ی": "ي", "ک": "ك", "\u0901": "\u0902"}.items()})
    return table


_FOLD = _folded_letters()
# In a pattern a folded character stands for itself: a full-width （ is a literal (, not a group.
_FOLD_PATTERN = {cp: re.escape(s) for cp, s in _FOLD.items()}


def fold(text: str) -> str:
    """``text`` as the patterns see it: lowercase, accents, harakat and the nukta dropped, dotless ı as i,
    Persian yeh and alef maksura as ي, chandrabindu as anusvara, curly quotes and full-width punctuation
    plain (！ is !, 。 stays)."""
    return text.lower() if text.isascii() else text.translate(_FOLD).lower()


def lower_outside_escapes(regex: str) -> str:
    """A pattern lowercased for folded text (so it needs no IGNORECASE, whose literals re cannot skip fast),
    each backslash escape kept as written: \\W is no \\w."""
    return re.sub(r"\\.|[^\\]+", lambda m: m.group(0) if m.group(0).startswith("\\") else m.group(0).lower(), regex)


@dataclass
class PatternFile:
    """One file's patterns (folded, references expanded, with their line numbers) and its named pieces."""
    lines: list[tuple[int, str]] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)


def _bad(path: Path, message: str) -> BadInputError:
    return BadInputError(message, path=path, hint="Fix or remove that line (one regular expression a line, "
                         "or @name = regex; the shipped qlift/quality/data/refusals/en.txt shows the format).")


def read_patterns(path: Path) -> PatternFile:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read refusal patterns ({exc})", path=path,
                            hint="Give a UTF-8 file with one regular expression a line.") from None
    out = PatternFile()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip().translate(_FOLD_PATTERN)
        if not line or line.startswith("#"):
            continue

        def expand(m: re.Match[str], lineno: int = lineno) -> str:
            if m.group(1) not in out.names:
                raise _bad(path, f"line {lineno} uses (?&{m.group(1)}) before any @{m.group(1)} = line")
            return f"(?:{out.names[m.group(1)]})"

        line = _REFERENCE.sub(expand, line)
        if (d := _DEFINITION.fullmatch(line)) is not None:
            out.names[d.group(1)] = d.group(2)
        else:
            out.lines.append((lineno, line))
    return out


def _first_chars(branch: str) -> frozenset[str] | None:
    """The characters a match of ``branch`` can start with, or None where that could be any (or a character
    ``\\W*`` also takes). Read from re's parse tree; a construct it does not know here counts as any."""
    try:  # re's own parser (private; typeshed has no stubs): without it every line is tried everywhere
        op, parser = import_module("re._constants"), import_module("re._parser")
    except ImportError:  # pragma: no cover - another Python's re layout
        return None

    def seq(items: Any) -> tuple[set[str] | None, bool]:
        chars: set[str] = set()
        for code, arg in items:
            first, empty = one(code, arg)
            if first is None:
                return None, False
            chars |= first
            if not empty:
                return chars, False
        return chars, True

    def one(code: Any, arg: Any) -> tuple[set[str] | None, bool]:
        if code is op.LITERAL:
            return {chr(arg)}, False
        if code is op.IN:
            chars: set[str] = set()
            for kind, value in arg:
                if kind is op.LITERAL:
                    chars.add(chr(value))
                elif kind is op.RANGE and value[1] - value[0] < 256:
                    chars.update(map(chr, range(value[0], value[1] + 1)))
                else:  # a negated class, \w, a wide range
                    return None, False
            return chars, False
        if code is op.BRANCH:
            parts = [seq(p) for p in arg[1]]
            if any(f is None for f, _ in parts):
                return None, False
            return set().union(*(f for f, _ in parts if f is not None)), any(e for _, e in parts)
        if code is op.SUBPATTERN:
            return seq(arg[3])
        if code in (op.MAX_REPEAT, op.MIN_REPEAT, op.POSSESSIVE_REPEAT):
            first, empty = seq(arg[2])
            return first, empty or arg[0] == 0
        if code in (op.AT, op.ASSERT, op.ASSERT_NOT):
            return set(), True  # takes no character
        return None, False

    try:
        first, empty = seq(parser.parse(branch))
    except Exception:  # noqa: BLE001 - a parse this reading does not follow: try the line everywhere
        return None
    if first is None or empty or any(not c.isalnum() and c != "_" for c in first):
        return None
    return frozenset(first)


class ByFirstLetter:
    """Alternatives matched at a position as one regular expression (``lead``, the alternation, ``tail``), of
    which only those that can start with the letter there are tried (a lead of \\W* skips to it); each letter's
    set is compiled the first time a clause starts with it."""

    def __init__(self, branches: list[str], lead: str = "", tail: str = "") -> None:
        self._branches, self._lead, self._tail = branches, lead, tail
        by_first: dict[str, list[int]] = {}
        anywhere: list[int] = []
        for i, branch in enumerate(branches):
            first = _first_chars(branch)
            for c in first or ():
                by_first.setdefault(c, []).append(i)
            if first is None:
                anywhere.append(i)
        self._anywhere = tuple(anywhere)
        self._by_first = {c: tuple(sorted({*ids, *anywhere})) for c, ids in by_first.items()}
        self._compiled: dict[tuple[int, ...], re.Pattern[str] | None] = {}
        self._by_letter: dict[str, re.Pattern[str] | None] = {}  # what each letter met so far tries

    @cached_property
    def regex(self) -> re.Pattern[str] | None:
        """All the alternatives in one: what trying only some of them must agree with."""
        return self._compile(tuple(range(len(self._branches))))

    def _compile(self, ids: tuple[int, ...]) -> re.Pattern[str] | None:
        if ids not in self._compiled:
            body = "|".join(f"(?:{self._branches[i]})" for i in ids)
            self._compiled[ids] = re.compile(f"{self._lead}(?:{body}){self._tail}") if ids else None
        return self._compiled[ids]

    def match(self, text: str, pos: int) -> re.Match[str] | None:
        letter = text[pos:pos + 1]
        if self._lead and not (letter.isalnum() or letter == "_"):  # \W* skips to the first word character
            first = _NON_WORD.match(text, pos).end()  # type: ignore[union-attr]  # \W* matches
            letter = text[first:first + 1]
        try:
            regex = self._by_letter[letter]
        except KeyError:  # the first time this letter opens a clause
            regex = self._by_letter[letter] = self._compile(self._by_first.get(letter, self._anywhere))
        return regex.match(text, pos) if regex is not None else None


@dataclass(frozen=True)
class Gate:
    """A file's @gate: its lines apply only to a text where it is found. One that is a single character class
    without an ASCII character (a script's) is not searched for in an ASCII text."""
    regex: re.Pattern[str]
    never_ascii: bool

    @classmethod
    def of(cls, pattern: str, flags: int = 0) -> Gate:
        regex = re.compile(pattern, flags)
        one_class = _ONE_CLASS.fullmatch(pattern) is not None
        return cls(regex, one_class and not any(regex.match(chr(c)) for c in range(128)))

    def opens(self, text: str) -> bool:
        return not (self.never_ascii and text.isascii()) and self.regex.search(text) is not None


class ShippedPatterns:
    """The shipped lines of one gate, matched at a clause start: each line's ^\\W* anchor is taken out front,
    and only the lines that can start with the clause's first letter are tried."""

    def __init__(self, branches: list[str], gate: str) -> None:
        self.gate = Gate.of(gate) if gate else None
        self._branches = branches

    @cached_property
    def lines(self) -> ByFirstLetter:
        """Built the first time the gate opens: most windows never meet most scripts."""
        return ByFirstLetter(self._branches, lead="\\W*")

    def opens(self, text: str) -> bool:
        return self.gate is None or self.gate.opens(text)

    def matches(self, opening: str, start: int) -> bool:
        return self.lines.match(opening, start) is not None


@dataclass(frozen=True)
class OwnPattern:
    """One line of a user's file, searched in the clause's text (its ^ is the clause start), case-insensitive
    as written."""
    regex: re.Pattern[str]
    gate: Gate | None = None

    def opens(self, text: str) -> bool:
        return self.gate is None or self.gate.opens(text)

    def matches(self, opening: str, start: int) -> bool:
        return self.regex.search(opening[start:]) is not None


@lru_cache(maxsize=1)
def builtin_files() -> tuple[tuple[Path, PatternFile], ...]:
    return tuple((p, read_patterns(p)) for p in sorted(BUILTIN.glob("*.txt")))


@lru_cache(maxsize=1)
def shipped() -> tuple[ShippedPatterns, ...]:
    """The shipped lines, one set a gate (the files of one script share theirs)."""
    by_gate: dict[str, list[str]] = {}
    for _, found in builtin_files():
        by_gate.setdefault(lower_outside_escapes(found.names.get("gate", "")), []).extend(
            lower_outside_escapes(line.removeprefix(ANCHOR)) for _, line in found.lines)
    return tuple(ShippedPatterns(branches, gate) for gate, branches in by_gate.items())


@lru_cache(maxsize=8)
def patterns(extra: Path | None = None) -> tuple[ShippedPatterns | OwnPattern, ...]:
    """The shipped patterns, then each line of ``extra`` on its own (a line may use backreferences, which an
    alternation would renumber)."""
    if extra is None:
        return shipped()
    found = read_patterns(extra)
    try:
        gate = Gate.of(found.names["gate"], re.IGNORECASE) if found.names.get("gate") else None
    except re.error as exc:
        raise _bad(extra, f"its @gate is not a regular expression ({exc})") from None
    own = []
    for lineno, line in found.lines:
        try:
            own.append(OwnPattern(re.compile(line, re.IGNORECASE), gate))
        except re.error as exc:
            raise _bad(extra, f"line {lineno} is not a regular expression ({exc})") from None
    return shipped() + tuple(own)
