"""Typed options for a stage, in vLLM's style: a dataclass whose fields carry their defaults and,
in the docstring under each field, their help. The CLI's options are generated from it
(``qlift/cli/options.py``), so code, ``--help`` and docs/cli.md share one definition.

Field metadata (all optional): ``short`` ("-o"), ``min``/``max`` (a number's lowest/highest value),
``above`` (a number's exclusive lower bound), ``choices`` (a None among them: not given; ``none``: its
CLI spelling, e.g. "auto"), ``flag_pair`` (a ``--x/--no-x`` switch; with a None default, "not given"),
``flag`` (the CLI spelling when it is not the field's name; ``--no-x`` for a True default: the switch
that turns it off), ``metavar``, ``envvar``, ``url`` (an http(s) URL), ``parse`` (a function from the
CLI's text to the field's value, raising BadInputError).

One generator makes the CLI's flags from every options class: these dataclasses (stage options) and
the pydantic models that are also config files (``RolloutSpec``'s sections, ``RouterConfig``). Each
class checks its own values and the rules between them on construction (``__post_init__`` raising
BadInputError naming the flag, or pydantic's validators), so the CLI, the release (which validates a
stage's options with pydantic's TypeAdapter, running the same ``__post_init__``) and a library caller
meet one rule, worded once. Stage options stay stdlib dataclasses: Click's types already convert the
flags and the release already checks the file's types, so pydantic dataclasses would add no check.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import typing
from collections.abc import Mapping
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
            shown = ", ".join(choice_texts(f.metadata))
            raise BadInputError(f"{value!r} is not one of {shown}", field=field_flag(f), hint=f"Use one of: {shown}.")


def choice_values(meta: Mapping[str, Any]) -> list[Any]:
    """A field's choices that the CLI offers (None only where it has a ``none`` word)."""
    return [c for c in meta["choices"] if c is not None or meta.get("none")]


def choice_texts(meta: Mapping[str, Any]) -> list[str]:
    """A field's choices as the CLI spells them (None: its ``none`` word, or left out)."""
    return [str(meta.get("none") if c is None else c) for c in choice_values(meta)]


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


def option_fields(cls: type) -> list[OptionField]:
    """Every field of an options class as the one flag generator (``qlift/cli/options.py``) reads it: a
    dataclass's fields (help from their docstrings, metadata as above), or a pydantic model's."""
    if dataclasses.is_dataclass(cls):
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        return [OptionField(f.name, field_flag(f), hints[f.name], _default(f), docs.get(f.name, ""), f.metadata)
                for f in dataclasses.fields(cls)]
    return [_model_field(name, info) for name, info in cls.model_fields.items()]  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class OptionField:
    """One field of an options class, as a flag: its parameter name, flag, type, default (MISSING: required),
    help, and metadata (the keys above; ``default_text``: help after any note, for a model's field)."""

    name: str
    flag: str
    annotation: Any
    default: Any
    help: str
    meta: Mapping[str, Any]


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _model_field(name: str, info: Any) -> OptionField:
    """A pydantic field as a flag that defaults to None (not given: a config file or the model's own default
    applies, and the model validates the value as it validates the file): choices from a Literal,
    ``--x/--no-x`` for a bool, text where pydantic parses the value itself (durations, percents)."""
    from pydantic import BeforeValidator
    from pydantic_core import PydanticUndefined

    ann, meta = info.annotation, dict[str, Any]()
    args = [a for a in get_args(ann) if a is not type(None)] if get_origin(ann) in (Union, UnionType) else [ann]
    base = args[0] if len(args) == 1 else ann
    if any(isinstance(m, BeforeValidator) for m in info.metadata):
        ann = str  # pydantic parses the text itself, as it parses the file's
    elif get_origin(base) is Literal:
        meta["choices"] = get_args(base)
    elif base is bool:
        meta["flag_pair"] = True
    elif base not in (int, float, Path):
        ann = str
    shown = "" if info.default is None or info.default is PydanticUndefined else f" [default: {info.default}]"
    meta["default_text"] = shown
    return OptionField(name, flag(name), ann, None, info.description or "", meta)
