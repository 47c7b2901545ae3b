"""JSON answers: parsing them as users' parsers would, and checking them against a schema."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?```\s*$", re.DOTALL)


def parse_json_output(text: str) -> tuple[bool, Any]:
    """(parsed?, value); one surrounding markdown code fence is tolerated."""
    m = _FENCE.match(text)
    body = m.group(1) if m else text
    try:
        return True, json.loads(body)
    except ValueError:
        return False, None


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def matches_schema(schema: dict[str, Any], text: str) -> bool:
    """The answer parses as JSON and validates against ``schema``."""
    ok, value = parse_json_output(text)
    if not ok:
        return False
    return bool(_validator(json.dumps(schema, sort_keys=True)).is_valid(value))


def request_schema(request: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a request's ``response_format`` asks the answer to follow (OpenAI's
    ``{"type": "json_schema", "json_schema": {"schema": ...}}``), or None. A schema that is no valid
    schema is None too: a request cannot hold the canary to a rule it failed to state."""
    fmt = request.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        return None
    try:
        _validator(json.dumps(schema, sort_keys=True))
    except Exception:  # jsonschema's SchemaError, or a schema it cannot resolve
        return None
    return schema


# Asking for JSON output, not talking about JSON: a question about JSON asks for prose and code ("How do I parse
# JSON in Python?", "What is the format of a JSON file?", "JSON格式是什么？", "如何用JSON保存配置？"). In Chinese
# an output verb (or 以, 按) comes next to the word JSON when JSON is asked for ("以JSON格式", "JSON格式输出").
_ASKS_JSON = re.compile(
    r"\b(respond|reply|answer|return|output|only)\b[^.?!\n]{0,30}\bjson\b"
    r"|\b(in|as|as an?)\s+json\b"
    r"|\bjson\b\s*only\b"
    r"|(以|按|按照|返回|输出|回复|回答|格式为|輸出|回覆|生成|给出|給出)\s*(一个|一份|为|為|成|标准|標準|合法|有效)?\s*json"
    r"|json\s*(格式|对象|對象)?\s*(返回|输出|回复|回答|輸出|回覆|给出|給出)", re.IGNORECASE)
_JSON_WORD = re.compile(r"\bjson\b", re.IGNORECASE)


def asks_json(request: dict[str, Any], system: str = "", user: str = "") -> bool:
    """The request asks for a JSON answer: response_format json_object or json_schema, the word JSON in
    its system prompt (a system prompt that names JSON sets the output format), or a user message that
    asks for JSON output ("answer in JSON", "return only JSON", "以JSON格式")."""
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return True
    return bool(_JSON_WORD.search(system) or _ASKS_JSON.search(user))


def json_invalid(asked: bool, text: str) -> bool | None:
    """True when JSON was asked and the answer does not parse (one markdown fence tolerated); None when
    JSON was not asked or the answer is empty (the empty-answer check counts those)."""
    if not asked or not text.strip():
        return None
    return not parse_json_output(text.strip())[0]
