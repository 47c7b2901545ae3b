"""Typed options objects (qlift/options.py): one dataclass per stage, checked the same way from code
and from the command line (the generated CLI itself: tests/test_cli_options.py)."""

from __future__ import annotations

import math

import pytest

from qlift.errors import BadInputError
from qlift.merge import MergeOptions


@pytest.mark.parametrize(("kw", "field"), [({"tolerance": math.nan}, "tolerance"),
                                           ({"tolerance": -1.0}, "tolerance"), ({"dtype": "int8"}, "dtype")])
def test_options_are_checked_from_code_too(kw, field) -> None:
    """From code the error names the field (the CLI names its flag: tests/test_cli_options.py)."""
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


@pytest.mark.parametrize(("kw", "field"), [({"num_samples": 0}, "num_samples"),
                                           ({"group_size": 48}, "group_size"), ({"device": "tpu"}, "device"),
                                           ({"method": "gptq"}, "method")])
def test_quantize_options_are_checked_from_code_too(kw, field) -> None:
    from qlift.quantize.options import QuantizeOptions

    with pytest.raises(BadInputError) as err:
        QuantizeOptions(**{"method": "awq", **kw})
    assert err.value.field == field


def _release_error(tmp_path, stage: dict) -> BadInputError:
    import yaml

    from qlift.release import load_release

    f = tmp_path / "release.yaml"
    f.write_text(yaml.safe_dump({"base": {"path": "base"}, "stages": [stage]}), encoding="utf-8")
    with pytest.raises(BadInputError) as err:
        load_release(f)
    return err.value


def test_a_rule_between_options_is_the_classs_so_cli_and_release_share_it(run_cli, tmp_path) -> None:
    """--judge needs --baseline, and FP8 takes no calibration: checked by the options class, so the command, a
    release file's stage and a library caller all meet the same one line; the class names fields, the command
    its flags (qlift/cli/options.py says each field named in backquotes by its flag)."""
    from test_bad_input import one_line

    from qlift.eval.options import EvalOptions
    from qlift.quantize.options import QuantizeOptions

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "x"}\n', encoding="utf-8")
    judge = "http://127.0.0.1:9#judge"
    with pytest.raises(BadInputError) as err:
        EvalOptions(prompts=prompts, judge=judge)
    assert err.value.field == "judge" and "no `baseline` was given" in err.value.message
    assert "--" not in err.value.one_line()
    one_line(run_cli("eval", "m", "--prompts", prompts, "--judge", judge), 2, "'--judge'", "no --baseline was given")
    found = _release_error(tmp_path, {"stage": "eval", "options": {"prompts": str(prompts), "judge": judge}})
    assert found.field == "options.judge" and "no `baseline` was given" in found.message

    with pytest.raises(BadInputError, match="apply to `method=awq` only") as err:
        QuantizeOptions(method="fp8", num_samples=8)
    assert "`num_samples`" in err.value.message and "--" not in err.value.one_line()
    one_line(run_cli("quantize", "m", "--fp8", "--seq-len", "64", "-o", tmp_path / "q"), 2, "apply to --awq only")
    found = _release_error(tmp_path, {"stage": "quantize", "options": {"method": "fp8", "num_samples": 8}})
    assert "apply to `method=awq` only" in found.message and "release.yaml" in str(found.path)


def test_quantize_takes_its_method_from_exactly_one_switch() -> None:
    from qlift.quantize.options import QuantizeOptions

    with pytest.raises(BadInputError, match="apply to `method=awq` only"):  # AWQ's alone: refused, never dropped
        QuantizeOptions.from_switches(awq=False, fp8=True, group_size=64)
    assert QuantizeOptions.from_switches(awq=True, fp8=False, group_size=64).method == "awq"
    for both in (True, False):
        with pytest.raises(BadInputError, match="together" if both else "choose a method"):
            QuantizeOptions.from_switches(awq=both, fp8=both)
