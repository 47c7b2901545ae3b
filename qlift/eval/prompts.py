"""Eval prompt sets: a JSONL file, one example per line, validated on load.

Each line is a JSON object::

    {"id": "capital-fr", "messages": [{"role": "user", "content": "Capital of France?"}],
     "reference": "Paris.", "tags": ["geo"],
     "checks": {"contains": "Paris", "max_chars": 200}}

``prompt`` (a plain string, no chat template) may stand in for ``messages``. A chat example may
offer OpenAI function ``tools`` (and a ``tool_choice``): the answer's tool calls are then checked
against them (``tool_call_broken``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from qlift.errors import BadInputError, NotFoundError
from qlift.loaders import iter_jsonl
from qlift.models.chat import ChatMessage

_HINT = "Each line must be a JSON object with 'id' and 'messages' (or 'prompt'); see docs/eval.md."


Message = ChatMessage  # the one chat message model (qlift/models/chat.py), shared with calibration sets


class Checks(BaseModel):
    """Pass/fail checks on the generated text; every check given must pass."""

    model_config = ConfigDict(extra="forbid")

    json_: bool = Field(False, alias="json", description="The output must parse as JSON.")
    json_schema: dict[str, Any] | None = Field(
        None, description="The output must parse as JSON and validate against this JSON Schema."
    )
    regex: str | None = Field(None, description="A Python regular expression the output must match (search).")
    contains: str | list[str] | None = Field(None, description="Substring(s) the output must contain.")
    max_chars: int | None = Field(None, ge=1, description="The output may have at most this many characters.")

    @field_validator("regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"invalid regular expression: {exc}") from exc
        return v

    @field_validator("json_schema")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            import jsonschema

            try:
                jsonschema.validators.validator_for(v).check_schema(v)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"invalid JSON Schema: {exc.message}") from exc
        return v

    @property
    def wants_json(self) -> bool:
        return self.json_ or self.json_schema is not None

    def is_empty(self) -> bool:
        return not (self.wants_json or self.regex or self.contains or self.max_chars)


class Example(BaseModel):
    """One held-out prompt, with what a good answer looks like."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="Unique within the file; names the example in reports.")
    messages: list[Message] | None = Field(None, description="Chat messages; the chat template is applied.")
    prompt: str | None = Field(None, description="A raw prompt, sent without a chat template.")
    reference: str | None = Field(None, description="The expected answer (for ppl, exact_match, rougeL, chrF).")
    checks: Checks | None = None
    tags: list[str] = Field(default_factory=list, description="Slices this example counts in.")
    tools: list[dict[str, Any]] | None = Field(
        None, description='OpenAI function tools offered with the messages ({"type": "function", "function": '
        '{"name", "parameters"}} each); the answer\'s tool calls are checked against them.')
    tool_choice: str | dict[str, Any] | None = Field(
        None, description='OpenAI tool_choice: "auto", "required", "none" or {"type": "function", "function": '
        '{"name"}}.')

    @model_validator(mode="after")
    def _one_prompt(self) -> Example:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of 'messages' or 'prompt'")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' is empty")
        if self.tools is not None and self.messages is None:
            raise ValueError("'tools' need 'messages' (a chat prompt)")
        if any(not isinstance(t.get("function"), dict) or not isinstance(t["function"].get("name"), str)
               for t in self.tools or []):
            raise ValueError('each tool must be {"type": "function", "function": {"name": ..., "parameters": ...}}')
        if self.tool_choice is not None and self.tools is None:
            raise ValueError("'tool_choice' needs 'tools'")
        return self

    def prompt_key(self) -> dict[str, Any]:
        """What the model sees (and what a cached generation is keyed by)."""
        if self.messages is not None:
            tools = {k: v for k, v in (("tools", self.tools), ("tool_choice", self.tool_choice)) if v is not None}
            return {"messages": [m.model_dump() for m in self.messages], **tools}
        return {"prompt": self.prompt}


def _describe(err: ValidationError) -> tuple[str, str | None]:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or None
    msg = str(first["msg"]).removeprefix("Value error, ")
    return msg, loc


def load_prompts(path: Path | str) -> list[Example]:
    """Read and validate a prompt set; the first bad line raises with file:line."""
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"prompt file {path} does not exist", hint="Check the --prompts path.")
    examples: list[Example] = []
    seen: dict[str, int] = {}
    for lineno, data in iter_jsonl(path, comments=True, hint=_HINT):
        if not isinstance(data, dict):
            raise BadInputError("a line must be a JSON object", path=path, line=lineno, hint=_HINT)
        try:
            ex = Example.model_validate(data)
        except ValidationError as exc:
            msg, loc = _describe(exc)
            raise BadInputError(msg, path=path, line=lineno, field=loc, hint=_HINT) from exc
        except RecursionError:  # a JSON Schema nested past what the checker follows
            raise BadInputError("nested too deeply to check", path=path, line=lineno, hint=_HINT) from None
        if ex.id in seen:
            raise BadInputError(
                f"duplicate id '{ex.id}' (first on line {seen[ex.id]})", path=path, line=lineno,
                hint="Give every example a unique id.",
            )
        seen[ex.id] = lineno
        examples.append(ex)
    if not examples:
        raise BadInputError("the prompt file has no examples", path=path, hint=_HINT)
    return examples
