"""Every stage option's range is refused by one validator, whether the value comes from Python, a release file or
the command line: pydantic's, run on the field's annotated type. From Python and a release file the error names
the field; from the CLI it names the flag (qlift/cli/options.py maps one to the other), exit 2."""

from __future__ import annotations

import functools
import math
import typing
from pathlib import Path
from types import UnionType
from typing import Any

import annotated_types as at
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError
from test_bad_input import one_line
from test_cli_options import COMMANDS

from qlift.deploy.options import DeployOptions
from qlift.errors import BadInputError
from qlift.hub.options import DownloadOptions
from qlift.options import Bound, field_bounds, option_fields
from qlift.perf.options import BatchOptions, BenchOptions, TuneOptions
from qlift.release.kinds import TABLE
from qlift.release.stage_options import ServeStageOptions
from qlift.serve.options import ServeOptions

CLI_ONLY = [ServeOptions, DeployOptions, DownloadOptions, BenchOptions, TuneOptions, BatchOptions]
CLASSES = [*(row.options for row in TABLE.values()), *CLI_ONLY]
REQUIRED: dict[str, dict[str, Any]] = {  # the least each class is built with (its range is checked first)
    "QuantizeOptions": {"method": "awq"}, "EvalOptions": {"prompts": Path("p.jsonl")},
    "DeployOptions": {"model": Path("."), "recipe": "cpu"},
    "TuneOptions": {"recipe": "cpu", "grid": ("max_num_seqs=4",)},
}
RANGED = [(cls, name) for cls in CLASSES for name in field_bounds(cls)]


def _is_float(cls: type, name: str) -> bool:
    hint = (cls.model_fields[name].annotation if issubclass(cls, BaseModel)  # type: ignore[attr-defined]
            else typing.get_type_hints(cls)[name])
    args = typing.get_args(hint) if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union else ()
    return float in (args or (hint,))


def _outside(bound: Bound, is_float: bool) -> st.SearchStrategy[float]:
    """Values that break one bound."""
    if isinstance(bound, at.Ge | at.Gt):
        low = float(bound.ge if isinstance(bound, at.Ge) else bound.gt)  # type: ignore[arg-type]
        if is_float:
            return st.floats(max_value=low, exclude_max=isinstance(bound, at.Ge), allow_nan=False)
        return st.integers(max_value=int(low) - (1 if isinstance(bound, at.Ge) else 0))
    high = float(bound.le if isinstance(bound, at.Le) else bound.lt)  # type: ignore[union-attr]
    if is_float:
        return st.floats(min_value=high, exclude_min=isinstance(bound, at.Le), allow_nan=False)
    return st.integers(min_value=int(high) + (1 if isinstance(bound, at.Le) else 0))


@st.composite
def bad_values(draw: st.DrawFn) -> tuple[type, str, float]:
    cls, name = draw(st.sampled_from(RANGED))
    is_float = _is_float(cls, name)
    wrong = [_outside(b, is_float) for b in field_bounds(cls)[name]]
    if is_float and not issubclass(cls, BaseModel):  # the options dataclasses also refuse what is not finite
        wrong.append(st.sampled_from([math.nan, math.inf, -math.inf]))
    return cls, name, draw(st.one_of(wrong))


@functools.cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


def _release_message(cls: type, name: str, value: float) -> str:
    """What validating ``{name: value}`` as a release file's stage options says: the field and the message."""
    data = {**REQUIRED.get(cls.__name__, {}), name: value}
    try:
        _adapter(cls).validate_python(data)
    except ValidationError as exc:
        err = next(e for e in exc.errors() if e["loc"][:1] == (name,))
        return str(err["msg"])
    except BadInputError as exc:  # a range declared in the field's metadata: the class's own check
        assert exc.field == name, exc
        return exc.message
    raise AssertionError(f"{cls.__name__}({name}={value!r}) was accepted from a release file")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_values())
def test_every_out_of_range_option_is_refused_naming_its_field(case: tuple[type, str, float]) -> None:
    cls, name, value = case
    from_release = _release_message(cls, name, value)
    if issubclass(cls, BaseModel):  # a pydantic model (router, promote): Python and the file are one validation
        return
    with pytest.raises(BadInputError) as err:
        cls(**REQUIRED.get(cls.__name__, {}), **{name: value})
    assert err.value.field == name, err.value
    assert from_release.split(" (got")[0] in err.value.message, (from_release, err.value.message)


def test_every_stage_and_command_class_has_ranges_to_check() -> None:
    """The property above is not vacuous: each class's known ranges are found."""
    ranged = {(cls.__name__, name) for cls, name in RANGED}
    expected = {("ServeStageOptions", "core"), ("ServeStageOptions", "kv_cache_gib"), ("ServeStageOptions", "port"),
                ("EvalOptions", "resamples"), ("QuantizeOptions", "threads"), ("MergeOptions", "tolerance"),
                ("RouterStageOptions", "port"), ("DeployOptions", "replicas"), ("BenchOptions", "timeout_s"),
                ("TuneOptions", "point_budget"), ("DownloadOptions", "max_workers"), ("BatchOptions", "temperature")}
    assert expected <= ranged, expected - ranged


def _python_says(cls: type, field: str, value: object) -> str:
    """The message ``cls(field=value)`` is refused with, without the field it names."""
    with pytest.raises(BadInputError) as err:
        cls(**REQUIRED.get(cls.__name__, {}), **{field: value})
    assert err.value.field == field and "--" not in err.value.one_line(), err.value
    return err.value.message.removeprefix(f"field '{field}': ")


@pytest.mark.parametrize(("field", "value"), [("core", -5), ("kv_cache_gib", 0), ("port", -5)])
def test_serve_stage_options_refuse_from_python(field: str, value: int) -> None:
    assert f"(got {value})" in _python_says(ServeStageOptions, field, value)


@pytest.mark.parametrize(("field", "value"), [("core", -5), ("kv_cache_gib", 0), ("port", -5)])
def test_serve_stage_options_refuse_from_a_release_file(run_cli, tmp_path: Path, field: str, value: int) -> None:
    (tmp_path / "base").mkdir()
    release = tmp_path / "release.yaml"
    release.write_text(yaml.safe_dump({"base": {"path": "base"},
                                       "stages": [{"stage": "serve", "options": {field: value}}]}), encoding="utf-8")
    line = one_line(run_cli("release", "run", release, "--dry-run"), 2, "release.yaml", f"'options.{field}'",
                    _python_says(ServeStageOptions, field, value))
    assert "--" not in line.split("`")[0], line  # the file's field, never a flag


def _cli_cases() -> list[tuple[list[str], type, str, str, float]]:
    """For each command's generated ranged flag: (argv, options class, flag, field, a value just outside)."""
    cases = []
    for name, (_, cls, excluded, _, least) in COMMANDS.items():
        flags = {f.name: f.flag for f in option_fields(cls)}
        for field, bounds in field_bounds(cls).items():
            if field in excluded:
                continue
            low = next((b for b in bounds if isinstance(b, at.Ge | at.Gt)), None)
            value = low.ge - 1 if isinstance(low, at.Ge) else low.gt  # type: ignore[operator,union-attr]
            value = float(value) if _is_float(cls, field) else value  # as the flag's type parses it
            command = ["deploy", "k8s"] if name == "deploy" else [name]
            cases.append(([*command, *least, flags[field], str(value)], cls, flags[field], field, value))
    return cases


CLI_CASES = _cli_cases()


@pytest.mark.parametrize(("argv", "cls", "flag", "field", "value"), CLI_CASES,
                         ids=[f"{c[0][0]} {c[2]}" for c in CLI_CASES])
def test_every_ranged_flag_is_refused_naming_the_flag(run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      argv: list[str], cls: type, flag: str, field: str,
                                                      value: float) -> None:
    """The class's own message, naming the flag instead of the field."""
    monkeypatch.chdir(tmp_path)  # deploy's MODEL is "."; nothing is written: the flag is refused first
    line = one_line(run_cli(*argv), 2, f"field '{flag}': {_python_says(cls, field, value)}")
    assert f"'{field}'" not in line, line
    assert not any(tmp_path.iterdir())


def test_serve_port_from_the_cli_names_the_flag(run_cli) -> None:
    line = one_line(run_cli("serve", "m", "--port", "-5"), 2, "field '--port': ")
    assert "greater than or equal to 0 (got -5)" in line, line
