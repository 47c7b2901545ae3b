"""Chat records read the same way wherever qlift takes them: eval prompt sets and quantize
calibration sets accept and refuse the same messages (qlift/models/chat.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qlift.errors import BadInputError
from qlift.eval.prompts import load_prompts
from qlift.quantize.calib import load_calibration

MESSAGES = {
    "system+user": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "assistant turn": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                       {"role": "user", "content": "Bye"}],
    "unknown role": [{"role": "robot", "content": "Hi"}],
    "tool role": [{"role": "tool", "content": "{}"}],
    "no content": [{"role": "user"}],
    "content not text": [{"role": "user", "content": 3}],
    "extra key": [{"role": "user", "content": "Hi", "nme": "typo"}],
    "empty": [],
    "not a list": "Hi",
}


def _outcome(load, path: Path) -> str:  # type: ignore[no-untyped-def]
    try:
        load(path)
    except BadInputError as exc:
        return f"refused: {exc.field}"
    return "ok"


@pytest.mark.parametrize("case", list(MESSAGES))
def test_eval_prompts_and_calibration_agree(case, tmp_path) -> None:
    messages = MESSAGES[case]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "messages": messages}) + "\n")
    calib = tmp_path / "calib.jsonl"
    calib.write_text(json.dumps({"messages": messages}) + "\n")
    got_eval, got_calib = _outcome(load_prompts, prompts), _outcome(load_calibration, calib)
    assert (got_eval == "ok") is (got_calib == "ok") is (case in ("system+user", "assistant turn")), (got_eval,
                                                                                                     got_calib)
    if case in ("unknown role", "tool role"):
        assert got_eval == got_calib == "refused: messages.0.role"
