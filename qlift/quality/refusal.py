"""Refusals: answers that decline to answer, by a documented pattern set (data/refusals.txt),
extensible from a file of the same format.

The patterns are anchored at a start (``^\\W*``), and they are tried at every clause start of the
answer's opening, not only at its first character: a fine-tune that learned to open politely
("Thanks for reaching out! Unfortunately I'm not able to help with refunds.") refuses all the same.
A clause starts after a sentence end, or after a comma that a contrast follows ("..., but I can't
help"); a leading "unfortunately", "but", "however" is skipped. A refusal phrase inside a clause
("Here is why I cannot recommend it") is no clause start, so explanations are not refusals.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from qlift.errors import BadInputError

BUILTIN = Path(__file__).parent / "data" / "refusals.txt"
OPENING_CHARS = 300
# Where a clause starts inside the opening: after a sentence end or a line break, or after a comma, a
# semicolon or a dash that a contrast word follows; the contrast word (and a softener after it) is skipped.
_CLAUSE = re.compile(
    r"(?:[.!?。！？\n]+[\s\"'”’)]*|[,;，；—–-]\s*(?=but\b|however\b|unfortunately\b|sadly\b|regrettably\b|但|不过|不過|可是|然而|遗憾|遺憾|很遗憾|抱歉|很抱歉|对不起|對不起))"
    r"(?:(?:but|however|unfortunately|sadly|regrettably|though|that said|i'?m afraid|"
    r"但是|但|不过|不過|可是|然而|遗憾的是|遺憾的是)[,，]?\s*)*", re.IGNORECASE)


def _compile(path: Path) -> list[re.Pattern[str]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read refusal patterns ({exc})", path=path,
                            hint="Give a UTF-8 file with one regular expression a line.") from None
    out = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            out.append(re.compile(line, re.IGNORECASE))
        except re.error as exc:
            raise BadInputError(f"line {lineno} is not a regular expression ({exc})", path=path,
                                hint="Fix or remove that line (one regular expression a line).") from None
    return out


@lru_cache(maxsize=8)
def patterns(extra: Path | None = None) -> tuple[re.Pattern[str], ...]:
    return tuple(_compile(BUILTIN) + (_compile(extra) if extra is not None else []))


def clauses(opening: str) -> list[str]:
    """The opening from each clause start on: the whole opening first, then each later clause."""
    return [opening] + [opening[m.end():] for m in _CLAUSE.finditer(opening) if m.end() < len(opening)]


def refuses(text: str, extra: Path | None = None) -> bool:
    """A refusal pattern matches at a clause start of the answer's first OPENING_CHARS characters."""
    opening = text.lstrip()[:OPENING_CHARS]
    pats = patterns(extra)
    return any(p.search(c) for c in clauses(opening) for p in pats)
