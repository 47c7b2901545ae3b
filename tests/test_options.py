"""Typed options objects (qlift/options.py): one dataclass per stage, checked the same way from code
and from the command line (the generated CLI itself: tests/test_cli_options.py)."""

from __future__ import annotations

import math

import pytest

from qlift.errors import BadInputError
from qlift.merge import MergeOptions


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


@pytest.mark.parametrize(("kw", "field"), [({"num_samples": 0}, "--num-samples"),
                                           ({"group_size": 48}, "--group-size"), ({"device": "tpu"}, "--device"),
                                           ({"method": "gptq"}, "--method")])
def test_quantize_options_are_checked_from_code_too(kw, field) -> None:
    from qlift.quantize.options import QuantizeOptions

    with pytest.raises(BadInputError) as err:
        QuantizeOptions(**{"method": "awq", **kw})
    assert err.value.field == field
