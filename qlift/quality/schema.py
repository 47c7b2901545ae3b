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
