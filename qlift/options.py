"""Typed options for a stage, in vLLM's style: a dataclass whose fields carry their defaults and,
in the docstring under each field, their help. The CLI's options are generated from it
(``qlift/cli/options.py``), so code, ``--help`` and docs/cli.md share one definition.

Field metadata (all optional): ``short`` ("-o"), ``min``/``max`` (a number's lowest/highest value),
``above`` (a number's exclusive lower bound), ``choices`` (a None among them: not given; ``none``: its
CLI spelling, e.g. "auto"), ``flag_pair`` (a ``--x/--no-x`` switch; with a None default, "not given"),
``flag`` (the CLI spelling when it is not the field's name; ``--no-x`` for a True default: the switch
that turns it off), ``metavar``, ``envvar``, ``url`` (an http(s) URL), ``parse`` (a function from the
CLI's text to the field's value, raising BadInputError).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import textwrap
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from qlift.errors import BadInputError


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right under it), as vLLM's get_attr_docs reads them."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for prev, node in zip(body, body[1:], strict=False):
        if (isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name)
                and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def flag(name: str) -> str:
    """The CLI spelling of a field name: max_shard_size -> --max-shard-size."""
    return "--" + name.replace("_", "-")


def field_flag(f: dataclasses.Field[Any]) -> str:
    """The CLI spelling of a field: its ``flag`` metadata, else from its name."""
    return str(f.metadata.get("flag") or flag(f.name))


def check_fields(options: Any) -> None:
    """The numeric limits and choices the fields' metadata declares (BadInputError naming the flag)."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        low, high, above = f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("above")
        if value is not None and not _within(value, low, high, above):
            span = _range_text(low, high, above)
            raise BadInputError(f"{value!r} is out of range ({span})", field=field_flag(f),
                                hint=f"Pass a number {span}.")
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            shown = ", ".join(choice_texts(f))
            raise BadInputError(f"{value!r} is not one of {shown}", field=field_flag(f), hint=f"Use one of: {shown}.")


def choice_texts(f: dataclasses.Field[Any]) -> list[str]:
    """A field's choices as the CLI spells them (None: its ``none`` word, or left out)."""
    none = f.metadata.get("none")
    return [str(none if c is None else c) for c in f.metadata["choices"] if c is not None or none]


def _within(value: Any, low: float | None, high: float | None, above: float | None) -> bool:
    if low is None and high is None and above is None:
        return True
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return (number and math.isfinite(value) and (low is None or value >= low) and (high is None or value <= high)
            and (above is None or value > above))


def number_text(v: float) -> str:
    """A bound as a user types it: 2147483647, not 2.14748e+09."""
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _range_text(low: float | None, high: float | None, above: float | None) -> str:
    parts = [f"{op} {number_text(v)}" for op, v in ((">=", low), ("<=", high), (">", above)) if v is not None]
    return " and ".join(parts)


def model_option(info: Any, flag: str, dest: str, *, note: str = "") -> Any:
    """A Click option for a pydantic field (``Model.model_fields[name]``): help from its description (plus
    ``note``) and default, choices from a Literal, ``--x/--no-x`` for a bool. It defaults to None: not
    given, so a config file or the model's own default applies."""
    import click
    from pydantic_core import PydanticUndefined

    ctype, is_bool = _click_type(info)
    default = info.default
    shown = "" if default is None or default is PydanticUndefined else f" [default: {default}]"
    text = (info.description or "") + note + shown
    if is_bool:
        return click.option(f"{flag}/--no-{flag[2:]}", dest, default=None, help=text)
    return click.option(flag, dest, type=ctype, default=None, help=text)


def _click_type(info: Any) -> tuple[Any, bool]:
    """(click type, is a bool flag) for a pydantic field; values pydantic parses itself stay strings."""
    import click
    from pydantic import BeforeValidator

    ann = info.annotation
    args = [a for a in get_args(ann) if a is not type(None)] if get_origin(ann) in (Union, UnionType) else [ann]
    base = args[0] if len(args) == 1 else ann
    if any(isinstance(m, BeforeValidator) for m in info.metadata):
        return click.STRING, False
    if get_origin(base) is Literal:
        return click.Choice([str(v) for v in get_args(base)]), False
    if base is bool:
        return None, True
    simple = {int: click.INT, float: click.FLOAT, Path: click.Path(path_type=Path)}
    return simple.get(base, click.STRING), False
