"""The one error hierarchy of qlift, and the one table mapping it to exit codes.

Every failure a user can cause or fix is a ``QliftError``: its message names the
problem, its ``hint`` names the fix. The CLI prints both on one line and exits with
the code from ``exit_code_for``; library callers catch the classes.
"""

from __future__ import annotations

from pathlib import Path


class QliftError(Exception):
    """A failure the user can act on."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message.rstrip(".")
        line = f"{text}. {self.hint}" if self.hint else text
        # A file name may hold a newline or another line break: shown escaped, it stays one line.
        return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in line)


class BadInputError(QliftError):
    """An argument, file or config that is malformed or contradictory."""

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        path: Path | str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        if field:
            where += f"field '{field}': "
        super().__init__(where + message, hint=hint)
        self.path = path
        self.line = line
        self.field = field


class NotFoundError(QliftError):
    """A path, model, recipe or remote file that does not exist."""


class OutputExistsError(QliftError):
    """An output that exists and would be overwritten without --force."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"output {path} already exists",
            hint="Pass --force to replace it, or choose another -o path.",
        )
        self.path = path


class IncompatibleError(QliftError):
    """Inputs that are each valid but do not fit together (shapes, hardware, formats)."""


class UnsafeInputError(QliftError):
    """Input refused for safety (pickle checkpoints, path traversal)."""


class ExternalToolError(QliftError):
    """A tool qlift drives (vLLM, llm-compressor, a hub) failed."""

    def __init__(self, message: str, *, hint: str | None = None, tool: str = "") -> None:
        super().__init__(message, hint=hint)
        self.tool = tool


class IntegrityError(QliftError):
    """A file whose content does not match its recorded or published hash."""


class GateFailedError(QliftError):
    """An evaluation or rollout gate that did not pass."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so it unwinds like Ctrl-C: temp outputs are
    removed and child processes stopped on the way out."""


# Ordered most specific first: the first matching class decides the exit code.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (GateFailedError, 10),
    (OutputExistsError, 3),
    (BadInputError, 2),
    (NotFoundError, 4),
    (UnsafeInputError, 5),
    (IncompatibleError, 6),
    (IntegrityError, 7),
    (ExternalToolError, 8),
    (QliftError, 1),
    (Terminated, 143),
    (KeyboardInterrupt, 130),
)
INTERNAL_ERROR_EXIT = 70


def exit_code_for(exc: BaseException) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return INTERNAL_ERROR_EXIT
