"""One loader per file format qlift reads from its users: JSON, JSON Lines, YAML.

Every way such a file can be wrong (unreadable, not UTF-8, not the syntax, nested
past what a parser can follow, a key given twice, the wrong shape for its model) becomes
one ``BadInputError`` line naming the file, the line where there is one, and the field.
Callers validate the parsed data with a pydantic model through ``validated``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from qlift.errors import BadInputError, NotFoundError

M = TypeVar("M", bound=BaseModel)

_FIX = "Fix or replace the file."


def read_bytes(path: Path, *, hint: str = _FIX) -> bytes:
    """The file's bytes; a missing path is NotFoundError, anything else unreadable is bad input."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise NotFoundError(f"{path} does not exist", hint="Check the path.") from None
    except IsADirectoryError:
        raise BadInputError("is a directory, not a file", path=path, hint=hint) from None
    except OSError as exc:
        raise BadInputError(f"cannot read it ({exc.strerror or exc})", path=path, hint=hint) from None


def decode(raw: bytes, *, path: Path | str, line: int | None = None, hint: str = _FIX) -> str:
    """UTF-8 text (a leading byte-order mark is dropped)."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadInputError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})", path=path, line=line, hint=hint,
        ) from None


def read_text(path: Path, *, hint: str = _FIX) -> str:
    return decode(read_bytes(path, hint=hint), path=path, hint=hint)


def parse_json(text: str | bytes, *, path: Path | str, line: int | None = None, hint: str = _FIX) -> Any:
    """Parsed JSON; syntax errors name the line (of the file, or the JSONL line given)."""
    if isinstance(text, bytes):
        text = decode(text, path=path, line=line, hint=hint)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if line is not None:  # one line of a JSON Lines file
            raise BadInputError(f"not valid JSON ({exc.msg} at column {exc.colno})", path=path, line=line,
                                hint=hint) from None
        raise BadInputError(f"invalid JSON at line {exc.lineno}: {exc.msg}", path=path, hint=hint) from None
    except RecursionError:
        raise BadInputError("JSON nested too deeply to read", path=path, line=line, hint=hint) from None


def read_json(path: Path, *, hint: str = _FIX) -> Any:
    return parse_json(read_text(path, hint=hint), path=path, hint=hint)


def read_json_object(path: Path, *, hint: str = _FIX) -> dict[str, Any]:
    data = read_json(path, hint=hint)
    if not isinstance(data, dict):
        raise BadInputError(f"must be a JSON object, not {_kind(data)}", path=path, hint=hint)
    return data


def iter_jsonl(source: Path | str, data: bytes | None = None, *, comments: bool = False,
               hint: str = _FIX) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line of a JSON Lines file (or of ``data``,
    named ``source``); with ``comments``, lines starting with ``#`` are skipped too."""
    raw_all = read_bytes(Path(source), hint=hint) if data is None else data
    for lineno, raw in enumerate(raw_all.split(b"\n"), start=1):
        text = decode(raw, path=source, line=lineno, hint=hint).strip()
        if text and not (comments and text.startswith("#")):
            yield lineno, parse_json(text, path=source, line=lineno, hint=hint)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that gives one key twice (YAML says keys are unique; PyYAML keeps the last)."""

    def __init__(self, key: Any, first: int, second: int, mark: Any) -> None:
        where = f"on line {first}" if first == second else f"(lines {first} and {second})"
        super().__init__(problem=f"key {str(key)!r} appears twice {where}", problem_mark=mark)


class UniqueKeyLoader(yaml.SafeLoader):
    """The loader of every YAML file qlift reads: ``yaml.SafeLoader`` (plain data only, no ``!!python``
    tags; an alias is the same object again, so anchor bombs and cycles are not expanded here and are
    refused by the model that validates them) that refuses a key given twice in one mapping. Merge
    keys (``<<: *base``) may still be overridden: only keys written in the mapping itself count."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the SafeLoader refuses it with its own error
                    continue
                if first is not None:
                    raise DuplicateKeyError(key, first, line, key_node.start_mark)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, *, path: Path | str, hint: str = _FIX) -> Any:
    """``text`` (the content of ``path``) as plain data, read by ``UniqueKeyLoader``."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: plain data only
    except DuplicateKeyError as exc:
        raise BadInputError(str(exc.problem), path=path, hint="Remove one of them.") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise BadInputError(f"invalid YAML: {getattr(exc, 'problem', None) or exc}", path=path,
                            line=mark.line + 1 if mark else None, hint=hint) from None
    except RecursionError:
        raise BadInputError("YAML nested too deeply to read", path=path, hint=hint) from None


def read_yaml(path: Path, *, hint: str = _FIX) -> Any:
    return parse_yaml(read_text(path, hint=hint), path=path, hint=hint)


def validated(model: type[M], data: Any, *, path: Path | str, line: int | None = None, prefix: str = "",
              hint: str = _FIX) -> M:
    """``model`` validated from ``data``; the first error names the field and the value found."""
    if not isinstance(data, dict):
        raise BadInputError(f"must be a JSON object, not {_kind(data)}", path=path, line=line,
                            field=prefix or None, hint=hint)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, path=path, line=line, prefix=prefix, hint=hint) from None
    except RecursionError:
        raise BadInputError("nested too deeply to read", path=path, line=line, hint=hint) from None


def validation_error(exc: ValidationError, *, path: Path | str, line: int | None = None, prefix: str = "",
                     hint: str = _FIX) -> BadInputError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] != "missing":
        msg += f" (got {_short(err.get('input'))})"
    return BadInputError(msg, path=path, line=line, field=loc or None, hint=hint)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)
