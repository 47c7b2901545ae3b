"""Typed options for a stage, in vLLM's style: a dataclass whose fields carry their defaults and,
in the docstring under each field, their help. The CLI's options are generated from it
(``qlift/cli/options.py``), so code, ``--help`` and docs/cli.md share one definition.

A number's range is part of its type: ``Annotated[int, Range(ge=1, le=64)]`` (``Seconds``: a positive, finite
float; pydantic's ``Field(ge=...)`` is read too). Pydantic's validator of that type is the one check: a release
file's stage options meet it when pydantic validates the file, a library caller when ``__post_init__`` calls
``check_fields``, and a CLI user through the flag generator, which checks the same fields and names the flag.
Errors raised here and in the options classes name the field; only ``qlift/cli/options.py`` turns a field into
its flag.

Field metadata (all optional): ``short`` ("-o"), ``choices`` (a None among them: not given; ``none``: its
CLI spelling, e.g. "auto"), ``flag_pair`` (a ``--x/--no-x`` switch; with a None default, "not given"),
``flag`` (the CLI spelling when it is not the field's name; ``--no-x`` for a True default: the switch
that turns it off), ``metavar``, ``envvar``, ``url`` (an http(s) URL), ``parse`` (a function from the
CLI's text to the field's value, raising BadInputError). ``min``/``max``/``above`` (ge/le/gt) are still read
for classes that declare a range there.

One generator makes the CLI's flags from every options class: these dataclasses (stage options) and
the pydantic models that are also config files (``RolloutSpec``'s sections, ``RouterConfig``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic.types import AllowInfNan

from qlift.errors import BadInputError

Bound = annotated_types.Ge | annotated_types.Gt | annotated_types.Le | annotated_types.Lt
_LEGACY_BOUNDS = (("min", "ge"), ("max", "le"), ("above", "gt"))  # metadata key -> pydantic's constraint


@dataclasses.dataclass(frozen=True)
class Range(annotated_types.GroupedMetadata):
    """A number's range, in its type: ``Annotated[int, Range(ge=1, le=64)]``: pydantic's ``Field(ge=1, le=64)``
    for a number that must also be finite (the JSON schema shows the bounds)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def __iter__(self) -> Iterator[object]:  # type: ignore[override]
        yield from (bound(value) for bound, value in ((annotated_types.Ge, self.ge), (annotated_types.Gt, self.gt),
                                                      (annotated_types.Le, self.le)) if value is not None)
        yield AllowInfNan(False)


Seconds = Annotated[float, Range(gt=0)]
"""A duration in seconds: a positive, finite number."""


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
    """Each field's range (``check_value``) and choices, in field order: BadInputError naming the field."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        check_value(type(options), f.name, value)
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            shown = ", ".join(choice_texts(f.metadata))
            raise BadInputError(f"{value!r} is not one of {shown}", field=f.name, hint=f"Use one of: {shown}.")


def check_value(cls: type, name: str, value: Any) -> None:
    """``value`` for field ``name`` of options class ``cls``, through pydantic's validator of the field's
    annotated type, as a release file's value is: BadInputError naming the field, worded as the release's."""
    adapter = ranged_fields(cls).get(name)
    if adapter is None:
        return
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        span = _range_text(field_bounds(cls)[name])
        raise BadInputError(f"{exc.errors()[0]['msg']} (got {shown})", field=name,
                            hint=f"Give a number {span}." if span else None) from None


@functools.cache
def ranged_fields(cls: type) -> dict[str, TypeAdapter[Any]]:
    """The fields of a dataclass that declare a range, each as the validator of its annotated type."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: TypeAdapter(_ranged_hint(f, hints[f.name])) for f in dataclasses.fields(cls)
            if _bounds(_ranged_hint(f, hints[f.name]))}


def field_bounds(cls: type) -> dict[str, list[Bound]]:
    """Each ranged field's bounds (annotated_types' Ge, Gt, Le, Lt): what a test draws values outside of."""
    if not dataclasses.is_dataclass(cls):  # a pydantic model
        infos: dict[str, FieldInfo] = cls.model_fields  # type: ignore[attr-defined]
        found = {name: [m for m in info.metadata if isinstance(m, Bound)] for name, info in infos.items()}
        return {name: bounds for name, bounds in found.items() if bounds}
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: _bounds(_ranged_hint(f, hints[f.name])) for f in dataclasses.fields(cls)
            if f.name in ranged_fields(cls)}


def _ranged_hint(f: dataclasses.Field[Any], hint: Any) -> Any:
    legacy = {key: f.metadata[meta] for meta, key in _LEGACY_BOUNDS if meta in f.metadata}
    return Annotated[hint, Range(**legacy)] if legacy else hint


def _bounds(hint: Any) -> list[Bound]:
    """The range an annotated type declares (inside an Optional too)."""
    if get_origin(hint) is Annotated:
        base, *extras = get_args(hint)
        found = [m for extra in extras for m in (extra.metadata if isinstance(extra, FieldInfo) else
                                                 list(extra) if isinstance(extra, Range) else [extra])]
        return [m for m in found if isinstance(m, Bound)] + _bounds(base)
    if get_origin(hint) in (Union, UnionType):
        return [b for arg in get_args(hint) for b in _bounds(arg)]
    return []


def choice_values(meta: Mapping[str, Any]) -> list[Any]:
    """A field's choices that the CLI offers (None only where it has a ``none`` word)."""
    return [c for c in meta["choices"] if c is not None or meta.get("none")]


def choice_texts(meta: Mapping[str, Any]) -> list[str]:
    """A field's choices as the CLI spells them (None: its ``none`` word, or left out)."""
    return [str(meta.get("none") if c is None else c) for c in choice_values(meta)]


def number_text(v: float) -> str:
    """A bound as a user types it: 2147483647, not 2.14748e+09."""
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _range_text(bounds: list[Bound]) -> str:
    """'>= 1 and <= 64': the bounds as a user writes them."""
    ops = {annotated_types.Ge: (">=", "ge"), annotated_types.Gt: (">", "gt"), annotated_types.Le: ("<=", "le"),
           annotated_types.Lt: ("<", "lt")}
    return " and ".join(f"{ops[type(b)][0]} {number_text(getattr(b, ops[type(b)][1]))}" for b in bounds)


def option_fields(cls: type) -> list[OptionField]:
    """Every field of an options class as the one flag generator (``qlift/cli/options.py``) reads it: a
    dataclass's fields (help from their docstrings, metadata as above), or a pydantic model's."""
    if dataclasses.is_dataclass(cls):
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        ranged = ranged_fields(cls)
        return [OptionField(f.name, field_flag(f), hints[f.name], _default(f), docs.get(f.name, ""),
                            {**f.metadata, "range": _range_text(field_bounds(cls)[f.name])} if f.name in ranged
                            else f.metadata)
                for f in dataclasses.fields(cls)]
    return [_model_field(name, info) for name, info in cls.model_fields.items()]  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class OptionField:
    """One field of an options class, as a flag: its parameter name, flag, type, default (MISSING: required),
    help, and metadata (the keys above; ``range``: a ranged field's bounds as text; ``default_text``: help after
    any note, for a model's field)."""

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
