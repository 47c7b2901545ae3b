"""Refusals: answers that decline to answer, by a documented pattern set (data/refusals.txt),
extensible from a file of the same format."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from qlift.errors import BadInputError

BUILTIN = Path(__file__).parent / "data" / "refusals.txt"
OPENING_CHARS = 300


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


def refuses(text: str, extra: Path | None = None) -> bool:
    opening = text.lstrip()[:OPENING_CHARS]
    return any(p.search(opening) for p in patterns(extra))
