"""Click options generated from a stage's typed options dataclass (``qlift/options.py``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from qlift.cli.params import Number
from qlift.options import field_docs, flag


def click_options(cls: type, *, exclude: tuple[str, ...] = ()) -> Callable[[Any], Any]:
    """A decorator adding one option per field of ``cls``, in field order, help from the field docs."""
    docs = field_docs(cls)

    def decorate(f: Any) -> Any:
        for field in reversed(dataclasses.fields(cls)):
            if field.name not in exclude:
                f = _option(field, docs.get(field.name, ""))(f)
        return f

    return decorate


def _option(field: dataclasses.Field[Any], help_text: str) -> Callable[[Any], Any]:
    meta, default = field.metadata, field.default
    names = [*([meta["short"]] if "short" in meta else []), flag(field.name)]
    if meta.get("flag_pair"):
        return click.option(f"{flag(field.name)}/--no-{field.name.replace('_', '-')}", field.name,
                            default=default, help=help_text, show_default=default is not None)
    if default is False:
        return click.option(*names, field.name, is_flag=True, default=False, help=help_text)
    kind: Any = None
    if "choices" in meta:
        kind = click.Choice(list(meta["choices"]))
    elif "min" in meta:
        kind = Number(float if isinstance(default, float) else int, low=meta["min"])
    return click.option(*names, field.name, type=kind, default=default, show_default=True, help=help_text)


def options_from(cls: type, kwargs: dict[str, Any]) -> Any:
    """``cls`` built from the command's keyword arguments named after its fields."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kwargs.items() if k in names})
