"""Content filters applied to prompts (and, through ``answerfilter``, to answers). A filter is anything with
``check(text) -> FilterHit | None``; ``max_match_chars``, when it has one, is the longest text a match spans
(how much of a streamed answer is held back).

The shipped one reads a word list file: one blocked word a line (case-insensitive, whole
words), or ``re:PATTERN`` for a regular expression; ``#`` starts a comment. The file is
re-read when its modification time or size changes, so edits apply without a restart.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from qlift.errors import BadInputError
from qlift.router.textnorm import (
    has_unspaced,
    is_unspaced,
    join_unspaced,
    mark_word_edges,
    normalize,
    request_texts,
)

log = logging.getLogger(__name__)

# A regular expression's match, in normalised characters, at most this long as far as streamed answers go:
# a pattern with no bounded width (``+``, ``*``) is taken to match no more; a longer match may pass a stream.
REGEX_MATCH_CHARS = 200


@dataclass(frozen=True)
class FilterHit:
    rule: str  # names the rule (file:line), never the matched text


class ContentFilter(Protocol):
    def check(self, text: str) -> FilterHit | None: ...


@dataclass(frozen=True)
class Rules:
    """The compiled rules of one filter file: one Aho-Corasick automaton for every word, a pattern per regex.

    A word rule matches whole words only where its script puts spaces between words: ``bomb``
    does not match ``bombastic``, ``炸弹`` matches inside ``如何制作炸弹``.
    """

    count: int
    longest: int  # the longest match a rule can make, in normalised characters (regexes: at most REGEX_MATCH_CHARS)
    words: Any  # ahocorasick.Automaton: normalised rule with its word edges marked -> rule name
    unspaced: Any  # the same for rules with CJK (or Thai, ...) in them, matched with the spaces taken out
    regexes: tuple[tuple[str, re.Pattern[str]], ...]

    def first_hit(self, text: str) -> str | None:
        """The name of a rule matching normalised ``text``, or None.

        The CJK automaton runs only on text with a CJK (Thai, ...) character in it: a rule holding one can match
        nowhere else, and pyahocorasick looks a character up among the root's children one by one (hundreds of
        CJK rules: ~9 us for a short English text, most of a streamed answer's check)."""
        unspaced = self.unspaced if self.unspaced is not None and not text.isascii() and has_unspaced(text) else None
        for automaton, variant in ((self.words, text), (unspaced, join_unspaced(text) if unspaced else "")):
            if automaton is not None:
                for _end, name in automaton.iter(mark_word_edges(variant)):
                    return str(name)
        for name, pattern in self.regexes:
            if pattern.search(text):
                return name
        return None


def _compile(path: Path, text: str) -> Rules:
    words: dict[str, str] = {}  # normalised word -> rule name (the first line that has it)
    regexes: list[tuple[str, re.Pattern[str]]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name = f"{path.name}:{lineno}"
        if line.startswith("re:"):
            try:
                regexes.append((name, re.compile(line[3:], re.IGNORECASE)))
            except re.error as exc:
                raise BadInputError(f"bad regular expression: {exc}", path=path, line=lineno,
                                    hint="Fix the pattern after re:.") from None
            continue
        word = normalize(line)
        if word:
            words.setdefault(word, name)
    spaced = {w: n for w, n in words.items() if not any(is_unspaced(c) for c in w)}
    unspaced = {join_unspaced(w): n for w, n in words.items() if w not in spaced}
    longest = max([len(w) for w in words] + [_width(p) for _, p in regexes] + [1])
    return Rules(len(words) + len(regexes), longest, _automaton(spaced), _automaton(unspaced), tuple(regexes))


def _width(pattern: re.Pattern[str]) -> int:
    """A pattern's longest match (sre's own width), capped at REGEX_MATCH_CHARS."""
    try:
        from re import _parser  # type: ignore[attr-defined]

        return min(int(_parser.parse(pattern.pattern, pattern.flags).getwidth()[1]), REGEX_MATCH_CHARS)
    except Exception:  # a private module: if it moves, the cap
        return REGEX_MATCH_CHARS


def _automaton(words: dict[str, str]) -> Any:
    if not words:
        return None
    import ahocorasick

    automaton = ahocorasick.Automaton()
    for word, name in words.items():
        automaton.add_word(mark_word_edges(word), name)
    automaton.make_automaton()
    return automaton


class WordListFilter:
    """Blocks prompts matching any rule of a word/regex list file; hot-reloads the file.

    A reload that cannot be read, decoded or compiled, or that yields no rules where there were
    some (an editor mid-save), keeps the previous rules: one warning line, and ``on_reload_failed``
    is called (the router counts it in ``qlift_router_filter_reload_failures_total``).
    """

    def __init__(self, path: Path, check_every_s: float = 0.5,
                 on_reload_failed: Callable[[], None] | None = None) -> None:
        self.path = path
        self.check_every_s = check_every_s
        self.on_reload_failed = on_reload_failed
        self._stamp: tuple[int, int] | None = None
        self._checked_at = 0.0
        self.rules = Rules(0, 1, None, None, ())
        self.reload(strict=True)

    def _file_stamp(self) -> tuple[int, int]:
        st = self.path.stat()
        return st.st_mtime_ns, st.st_size

    def reload(self, *, strict: bool = False) -> None:
        """Re-read the file. At start a bad file is an error; later the old rules stay and a warning is logged."""
        stamp: tuple[int, int] | None = None
        try:
            stamp = self._file_stamp()
            rules = _compile(self.path, self.path.read_text(encoding="utf-8"))
            if rules.count == 0 and self.rules.count > 0:
                raise BadInputError("it has no rules now (an editor mid-save?)", path=self.path)
        except (OSError, UnicodeDecodeError, BadInputError) as exc:
            if isinstance(exc, OSError):
                problem = f"cannot read it: {exc.strerror or exc}"
            elif isinstance(exc, UnicodeDecodeError):
                problem = f"not UTF-8 (byte {exc.start})"
            else:
                problem = exc.one_line()
            if strict:
                if isinstance(exc, BadInputError):
                    raise
                raise BadInputError(f"filter file {problem}", path=self.path,
                                    hint="Check filter_file (UTF-8 text, one rule a line).") from None
            self._stamp = stamp  # retried when the file changes again, not on every request
            log.warning("filter file %s not reloaded, keeping its %d previous rules: %s", self.path,
                        self.rules.count, problem)
            if self.on_reload_failed is not None:
                self.on_reload_failed()
            return
        self.rules, self._stamp = rules, stamp
        log.info("content filter: %d rules from %s", rules.count, self.path)

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked_at < self.check_every_s:
            return
        self._checked_at = now
        try:
            stamp = self._file_stamp()
        except OSError:
            stamp = None
        if stamp != self._stamp:
            self.reload()

    @property
    def max_match_chars(self) -> int:
        """The longest match the current rules make (normalised characters): what a stream holds back."""
        self._maybe_reload()
        return self.rules.longest

    def check(self, text: str) -> FilterHit | None:
        self._maybe_reload()
        name = self.rules.first_hit(normalize(text))
        return None if name is None else FilterHit(name)


def prompt_text(body: dict[str, Any]) -> str:
    """Every text of a request the model reads, one field a line (see ``textnorm.request_texts``)."""
    return "\n".join(request_texts(body))
