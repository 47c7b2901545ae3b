"""Click parameter types for numbers and URLs, checked before a command does any work.

A bad value is a ``BadInputError`` (exit 2, one line naming the option), not Click's
multi-line usage error, and never reaches the library as NaN, a negative count or a
port no socket takes.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

import click

from qlift.errors import BadInputError
from qlift.options import number_text


def _option_name(param: click.Parameter | None) -> str | None:
    if param is None:
        return None
    opts = [o for o in getattr(param, "opts", []) if o.startswith("--")]
    return opts[0] if opts else (param.human_readable_name or None)


class Number(click.ParamType):
    """An int or float within [low, high]; floats must be finite."""

    def __init__(self, kind: type[int] | type[float], *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, hint: str | None = None) -> None:
        self.kind, self.low, self.high, self.low_open, self.hint = kind, low, high, low_open, hint
        self.name = "integer" if kind is int else "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        field = _option_name(param)
        if isinstance(value, self.kind) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = self.kind(str(value).strip())
            except (ValueError, OverflowError):
                raise BadInputError(f"{value!r} is not {'an integer' if self.kind is int else 'a number'}",
                                    field=field, hint=self._hint()) from None
        if isinstance(number, float) and not math.isfinite(number):
            raise BadInputError(f"{value!r} is not a finite number", field=field, hint=self._hint())
        too_low = self.low is not None and (number <= self.low if self.low_open else number < self.low)
        if too_low or (self.high is not None and number > self.high):
            raise BadInputError(f"{value!r} is out of range ({self._range()})", field=field, hint=self._hint())
        return number

    def _range(self) -> str:
        low = "" if self.low is None else f"{'>' if self.low_open else '>='} {number_text(self.low)}"
        high = "" if self.high is None else f"<= {number_text(self.high)}"
        return " and ".join(p for p in (low, high) if p)

    def _hint(self) -> str:
        return self.hint or f"Pass {'an integer' if self.kind is int else 'a number'} {self._range()}."


class HttpUrl(click.ParamType):
    """An http(s) URL with a host (and a valid port, if one is given)."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        field = _option_name(param)
        text = str(value)
        hint = "Pass a URL like http://127.0.0.1:8000."
        try:
            parts = urlsplit(text)
            port = parts.port  # raises ValueError when out of range or not a number
        except ValueError as exc:
            raise BadInputError(f"{text!r} is not a valid URL ({exc})", field=field, hint=hint) from None
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in text):
            raise BadInputError(f"{text!r} is not an http(s) URL with a host", field=field, hint=hint)
        if port == 0:
            raise BadInputError(f"{text!r} has port 0", field=field, hint=hint)
        return text


def count(low: int = 1, high: int | None = None, hint: str | None = None) -> Number:
    return Number(int, low=low, high=high, hint=hint)


PORT = Number(int, low=0, high=65535, hint="Pass a port from 1 to 65535 (0: any free port).")
URL = HttpUrl()
