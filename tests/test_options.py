"""Typed options objects (qlift/options.py): one dataclass per stage, the CLI's options generated
from it, checked the same way from code and from the command line."""

from __future__ import annotations

import dataclasses
import math

import pytest

from qlift.cli.merge import merge_cmd
from qlift.errors import BadInputError
from qlift.merge import MergeOptions
from qlift.options import field_docs, flag


def test_every_merge_option_is_a_documented_field() -> None:
    docs = field_docs(MergeOptions)
    params = {p.name: p for p in merge_cmd.params}
    for f in dataclasses.fields(MergeOptions):
        assert docs.get(f.name), f"{f.name} has no docstring"
        p = params[f.name]
        assert flag(f.name) in p.opts + getattr(p, "secondary_opts", []), p.opts
        assert p.help == docs[f.name]
        assert p.default == f.default, f.name
    cli_only = set(params) - {f.name for f in dataclasses.fields(MergeOptions)}
    assert {"base", "adapters", "output"} <= cli_only and len(cli_only) == 4  # and --json


@pytest.mark.parametrize(("kw", "field"), [({"tolerance": math.nan}, "--tolerance"),
                                           ({"tolerance": -1.0}, "--tolerance"), ({"dtype": "int8"}, "--dtype")])
def test_options_are_checked_from_code_too(kw, field) -> None:
    with pytest.raises(BadInputError) as err:
        MergeOptions(**kw)
    assert err.value.field == field


def test_merge_model_takes_field_names_as_keywords(tmp_path) -> None:
    from qlift.merge import merge_model

    with pytest.raises(TypeError):
        merge_model(base=tmp_path, adapters=[tmp_path], out=tmp_path / "o", verfy=False)


def test_cli_values_reach_the_options(run_cli, tmp_path) -> None:
    r = run_cli("merge", tmp_path / "nope", tmp_path / "lora", "-o", tmp_path / "o", "--tolerance", "-1")
    assert r.exit_code == 2 and "--tolerance" in r.stderr and "Traceback" not in r.stderr


def test_quantize_options_match_the_cli() -> None:
    """quantize's CLI keeps --awq/--fp8 and --group-size auto of its own; every other option is checked
    against QuantizeOptions: same name, same help."""
    from qlift.cli.quantize import quantize_cmd
    from qlift.quantize.options import QuantizeOptions

    docs = field_docs(QuantizeOptions)
    params = {p.name: p for p in quantize_cmd.params}
    for f in dataclasses.fields(QuantizeOptions):
        assert docs.get(f.name), f"{f.name} has no docstring"
        if f.name == "method":
            assert {"awq", "fp8"} <= set(params)
            continue
        assert params[f.name].help == docs[f.name], f.name
        assert flag(f.name) in params[f.name].opts


@pytest.mark.parametrize(("kw", "field"), [({"num_samples": 0}, "--num-samples"),
                                           ({"group_size": 48}, "--group-size"), ({"device": "tpu"}, "--device"),
                                           ({"method": "gptq"}, "--method")])
def test_quantize_options_are_checked_from_code_too(kw, field) -> None:
    from qlift.quantize.options import QuantizeOptions

    with pytest.raises(BadInputError) as err:
        QuantizeOptions(**{"method": "awq", **kw})
    assert err.value.field == field


def test_eval_options_match_the_cli() -> None:
    """Every eval option is an EvalOptions field of the same name and help (eval_cmd no longer
    passes its keywords through unchecked: EvalOptions refuses a name it does not have)."""
    from qlift.cli.eval import eval_cmd
    from qlift.eval import EvalOptions

    docs = field_docs(EvalOptions)
    params = {p.name: p for p in eval_cmd.params if p.name not in ("candidate", "no_cache", "json_output")}
    fields = {f.name for f in dataclasses.fields(EvalOptions)}
    assert set(params) == fields - {"use_cache"}
    for name, p in params.items():
        assert p.help == docs[name], name
    assert docs["use_cache"]
    with pytest.raises(TypeError):
        EvalOptions(prompts="p.jsonl", bootstrap=5)  # type: ignore[arg-type, call-arg]
