"""Typed options for a stage, in vLLM's style: a dataclass whose fields carry their defaults and,
in the docstring under each field, their help. The CLI's options are generated from it
(``qlift/cli/options.py``), so code, ``--help`` and docs/cli.md share one definition.

Field metadata (all optional): ``short`` ("-o"), ``min`` (a number's lowest value), ``choices``
(for a str), ``flag_pair`` (a ``--x/--no-x`` switch; with a None default, "not given").
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import textwrap
from typing import Any

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
    """The CLI spelling of a field: max_shard_size -> --max-shard-size."""
    return "--" + name.replace("_", "-")


def check_fields(options: Any) -> None:
    """The numeric limits and choices the fields' metadata declares (BadInputError naming the flag)."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        low = f.metadata.get("min")
        if low is not None and value is not None and not _at_least(value, low):
            raise BadInputError(f"{value!r} is out of range (>= {low:g})", field=flag(f.name),
                                hint=f"Pass a number >= {low:g}.")
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise BadInputError(f"{value!r} is not one of {', '.join(map(str, choices))}", field=flag(f.name),
                                hint=f"Use one of: {', '.join(map(str, choices))}.")


def _at_least(value: Any, low: float) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and value >= low
