"""Content filters applied to prompts. A filter is anything with ``check(text) -> FilterHit | None``.

The shipped one reads a word list file: one blocked word a line (case-insensitive, whole
words), or ``re:PATTERN`` for a regular expression; ``#`` starts a comment. The file is
re-read when its modification time or size changes, so edits apply without a restart.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from qlift.errors import BadInputError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FilterHit:
    rule: str  # names the rule (file:line), never the matched text


class ContentFilter(Protocol):
    def check(self, text: str) -> FilterHit | None: ...


def _compile(path: Path, text: str) -> list[tuple[str, re.Pattern[str]]]:
    rules = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            if line.startswith("re:"):
                pattern = re.compile(line[3:], re.IGNORECASE)
            else:
                pattern = re.compile(r"(?<!\w)" + re.escape(line) + r"(?!\w)", re.IGNORECASE)
        except re.error as exc:
            raise BadInputError(f"bad regular expression: {exc}", path=path, line=lineno,
                                hint="Fix the pattern after re:.") from None
        rules.append((f"{path.name}:{lineno}", pattern))
    return rules


class WordListFilter:
    """Blocks prompts matching any rule of a word/regex list file; hot-reloads the file."""

    def __init__(self, path: Path, check_every_s: float = 0.5) -> None:
        self.path = path
        self.check_every_s = check_every_s
        self._stamp: tuple[int, int] | None = None
        self._checked_at = 0.0
        self.rules: list[tuple[str, re.Pattern[str]]] = []
        self.reload(strict=True)

    def _file_stamp(self) -> tuple[int, int]:
        st = self.path.stat()
        return st.st_mtime_ns, st.st_size

    def reload(self, *, strict: bool = False) -> None:
        """Re-read the file. At start a bad file is an error; later the old rules stay and a warning is logged."""
        try:
            stamp = self._file_stamp()
            rules = _compile(self.path, self.path.read_text(encoding="utf-8"))
        except (OSError, BadInputError) as exc:
            if strict:
                if isinstance(exc, OSError):
                    raise BadInputError(f"cannot read filter file: {exc.strerror}", path=self.path,
                                        hint="Check filter_file.") from None
                raise
            log.warning("filter file %s not reloaded (keeping %d rules): %s", self.path, len(self.rules), exc)
            return
        self.rules, self._stamp = rules, stamp
        log.info("content filter: %d rules from %s", len(rules), self.path)

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked_at < self.check_every_s:
            return
        self._checked_at = now
        try:
            stamp = self._file_stamp()
        except OSError:
            return
        if stamp != self._stamp:
            self.reload()

    def check(self, text: str) -> FilterHit | None:
        self._maybe_reload()
        for name, pattern in self.rules:
            if pattern.search(text):
                return FilterHit(name)
        return None


def prompt_text(body: dict[str, Any]) -> str:
    """Everything a client asks the model to read: chat message contents or completion prompts."""
    parts: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        parts.append(prompt)
    elif isinstance(prompt, list):
        parts += [p for p in prompt if isinstance(p, str)]
    return "\n".join(parts)
