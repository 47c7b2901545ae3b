"""How commands talk to the user: results on stdout (text or --json), logs on stderr."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from qlift.serialize import to_jsonable

T = TypeVar("T")


@dataclass
class CliState:
    """Global options, set once by the top-level group."""

    json: bool = False
    verbose: int = 0
    quiet: bool = False
    debug: bool = False


STATE = CliState()


def emit(result: Any, human: Callable[[], None] | None = None) -> None:
    """Print a command's result: JSON on stdout with --json, else the human renderer."""
    if STATE.json:
        click.echo(json.dumps(to_jsonable(result), indent=2))
    elif human is not None:
        human()


def json_option(f: Callable[..., T]) -> Callable[..., T]:
    """Per-command ``--json``, equivalent to the global ``qlift --json``."""

    def set_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        if value:
            STATE.json = True
        return value

    return click.option(
        "--json", "json_output", is_flag=True, expose_value=False, callback=set_json,
        is_eager=True, help="Print the result as JSON on stdout (logs stay on stderr).",
    )(f)


class _StderrFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.levelno >= logging.WARNING:
            return f"{record.levelname.lower()}: {msg}"
        return msg


def configure_logging() -> None:
    level = logging.INFO
    if STATE.quiet:
        level = logging.WARNING
    if STATE.verbose or STATE.debug:
        level = logging.DEBUG
    logger = logging.getLogger("qlift")
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_StderrFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
