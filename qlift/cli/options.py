"""The one flag generator: Click options from an options class (``qlift/options.py``), a stage's options
dataclass or a pydantic config model (a rollout spec's sections, the router's settings).

It is also the one place a field becomes its flag: the options classes check their values and name the field
(as a release file's user reads it); here a failing field of the command's options class is named by its flag,
exit 2, whether it failed as the flag's text was parsed, as the value was checked against the field's range
(``check_value``, the check the class itself runs) or as the command built its options. A message or hint names
other fields in backquotes (``no `baseline` was given``): each is named by its flag too (``no --baseline was
given``); a command whose flags are not one a field (``qlift quantize``'s --awq) adds its own spellings."""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from qlift.cli.params import URL, Number
from qlift.errors import BadInputError
from qlift.options import OptionField, check_value, choice_texts, choice_values, option_fields


def click_options(source: type | Sequence[OptionField], *, exclude: tuple[str, ...] = (),
                  spelled: Mapping[str, str] | None = None) -> Callable[[Any], Any]:
    """A decorator adding one option per field of ``source`` (an options class, or fields from
    ``option_fields`` renamed or narrowed by the caller), in field order. ``spelled``: how the command says
    what an error names in backquotes besides its fields (``{"method=awq": "--awq"}``)."""
    fields = option_fields(source) if isinstance(source, type) else list(source)

    def decorate(f: Any) -> Any:
        for field in reversed(fields):
            if field.name not in exclude:
                f = _option(field)(f)
        if isinstance(source, type) and dataclasses.is_dataclass(source):
            flags = {fl.name: fl.flag for fl in fields if fl.name not in exclude}
            return _checked(f, source, flags, {**flags, **(spelled or {})})
        return f

    return decorate


def _checked(command: Callable[..., Any], cls: type, flags: dict[str, str], names: dict[str, str]
             ) -> Callable[..., Any]:
    """``command`` with its flags' values checked as ``cls`` checks its fields (before any work), and a
    BadInputError raised anywhere in the command saying each of those fields (and each of ``names``) it names
    by its flag."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            for name in flags:
                if name in kwargs:
                    check_value(cls, name, kwargs[name])
            return command(*args, **kwargs)
        except BadInputError as exc:
            said = as_flags(exc, names)
            if said is exc:
                raise
            raise said from None

    return run


_NAMED = re.compile(r"`([A-Za-z_][\w.=-]*)`")  # a field, as an error names it in its message or hint


def as_flags(exc: BadInputError, flags: Mapping[str, str]) -> BadInputError:
    """``exc`` (naming fields) as the CLI says it: the field it failed on, and each field its message and hint
    name in backquotes, named by its flag in ``flags`` (others left as they are); ``exc`` itself when it names
    none of them, or is about a file."""
    if exc.path is not None:
        return exc

    def said(text: str) -> str:
        return _NAMED.sub(lambda m: flags.get(m.group(1), m.group(0)), text)

    message = exc.message.removeprefix(f"field '{exc.field}': ") if exc.field else exc.message
    field = flags.get(exc.field, exc.field) if exc.field else exc.field
    hint = said(exc.hint) if exc.hint else exc.hint
    if field == exc.field and said(message) == message and hint == exc.hint:
        return exc
    return BadInputError(said(message), field=field, hint=hint)


class Parsed(click.ParamType):
    """The CLI's text through a field's ``parse`` function (its BadInputError, naming the field, names the
    flag)."""

    name = "text"

    def __init__(self, parse: Callable[[str], Any]) -> None:
        self.parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except BadInputError as exc:
            flag = max(param.opts, key=len) if param is not None else None
            if exc.path is not None or flag is None or exc.field is None:
                raise
            raise as_flags(exc, {exc.field: flag}) from None


def _option(field: OptionField) -> Callable[[Any], Any]:
    meta, name, opt, default = field.meta, field.name, field.flag, field.default
    help_text = field.help + meta.get("default_text", "")
    common: dict[str, Any] = {"help": help_text, "metavar": meta.get("metavar"), "envvar": meta.get("envvar")}
    names = [*([meta["short"]] if "short" in meta else []), opt]
    if meta.get("flag_pair"):
        return click.option(f"{opt}/--no-{opt.removeprefix('--')}", name, default=default,
                            show_default=default is not None, **common)
    if isinstance(default, bool):  # False: --x turns it on; True: its flag (e.g. --no-cache) turns it off
        return click.option(*names, name, is_flag=True, flag_value=not default, default=default, **common)
    kind, multiple = _base_type(field.annotation)
    show = default not in (None, (), {}) and default is not dataclasses.MISSING
    if "parse" in meta:
        kind, multiple = Parsed(meta["parse"]), False
        if isinstance(default, tuple):  # shown as it is typed; Parsed parses it back
            default = ",".join(map(str, default))
    elif "choices" in meta:
        texts = dict(zip(choice_texts(meta), choice_values(meta), strict=True))  # CLI spelling -> value
        kind = click.Choice(list(texts))
        common["callback"] = lambda ctx, param, value: texts.get(value, value)
        if default is None and meta.get("none"):
            default, show = meta["none"], True
    elif "range" in meta:  # parsed here, its range checked by the field's own check (``_checked``)
        kind = Number(kind, hint=f"Pass {'an integer' if kind is int else 'a number'} {meta['range']}.")
    elif meta.get("url"):
        kind = URL
    required = default is dataclasses.MISSING
    return click.option(*names, name, type=kind, multiple=multiple, required=required,
                        default=None if required else default, show_default=show, **common)


def _base_type(hint: Any) -> tuple[Any, bool]:
    """(the Click type of one value, whether the option repeats) for a field's type."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return _base_type(args[0])
    if typing.get_origin(hint) is tuple:
        return _base_type(args[0])[0], True
    if hint is Path:
        return click.Path(path_type=Path), False
    return (hint if hint in (int, float, str) else None), False
