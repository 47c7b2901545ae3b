"""Router settings (qlift/router/config.py): a number that is not finite is refused, naming its field."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from qlift.errors import BadInputError
from qlift.router.config import load_config, parse_config


@pytest.mark.parametrize(("section", "key"), [("timeouts", "idle_s"), ("timeouts", "request_s"),
                                              ("limits", "requests_per_s"), ("server", "body_timeout_s"),
                                              ("health", "interval_s"), (None, "drain_s")])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_float_setting_is_refused_unless_finite(section: str | None, key: str, value: float) -> None:
    data = {section: {key: value}} if section else {key: value}
    with pytest.raises(BadInputError) as err:
        parse_config(data, path="router.yaml")
    field = f"{section}.{key}" if section else key
    assert err.value.field == field and "finite" in err.value.message, err.value.one_line()


def test_yamls_inf_is_refused_in_a_file(tmp_path: Path) -> None:
    f = tmp_path / "router.yaml"
    f.write_text("timeouts:\n  request_s: .inf\n", encoding="utf-8")
    with pytest.raises(BadInputError) as err:
        load_config(f)
    assert err.value.field == "timeouts.request_s" and str(f) in err.value.one_line()
    f.write_text("timeouts:\n  request_s: 5.5\n", encoding="utf-8")
    assert load_config(f).timeouts.request_s == 5.5
