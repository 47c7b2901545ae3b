"""Calibration samples: a user's JSONL (``messages`` or ``text`` per line) or the built-in set."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, NotFoundError
from qlift.loaders import iter_jsonl, validated
from qlift.models.chat import ChatRecord

BUILTIN_NAME = "builtin"
# (num_samples, seq_len) when not given: AWQ on a CPU is slow, so less of it there.
# None samples: all of the set.
DEFAULTS: dict[str, tuple[int | None, int]] = {"cpu": (32, 256), "cuda": (None, 512)}


def builtin_text() -> str:
    return (resources.files("qlift.quantize") / "data" / "calibration.jsonl").read_text(encoding="utf-8")


def load_calibration(path: Path | None) -> list[dict[str, Any]]:
    """Validated records; each has either ``messages`` (chat turns) or ``text``."""
    if path is None:
        return _parse("built-in calibration set", builtin_text().encode("utf-8"))
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"calibration file {path} does not exist", hint="Check the --calib path.")
    return _parse(path, None)


def _parse(source: Path | str, data: bytes | None) -> list[dict[str, Any]]:
    hint = "Each line must be one JSON object."
    records = [_check(rec, source, lineno) for lineno, rec in iter_jsonl(source, data, hint=hint)]
    if not records:
        raise BadInputError("no calibration samples", path=source,
                            hint='Add lines like {"text": "..."} or {"messages": [...]}.')
    return records


def _check(rec: Any, source: Path | str, lineno: int) -> dict[str, Any]:
    hint = 'Use {"messages": [{"role": "user", "content": "..."}, ...]} or {"text": "..."}.'
    if not isinstance(rec, dict):
        raise BadInputError("a line is not a JSON object", path=source, line=lineno, hint=hint)
    if isinstance(rec.get("text"), str) and rec["text"].strip():
        return {"text": rec["text"]}
    if rec.get("messages") is None:
        raise BadInputError("needs a 'messages' list or a 'text' string", path=source, line=lineno, hint=hint)
    chat = validated(ChatRecord, rec, path=source, line=lineno, hint=hint)  # the roles eval prompts take
    return {"messages": [m.model_dump() for m in chat.messages]}
