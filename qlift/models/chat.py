"""One chat message, as every file qlift reads chat records from spells it (eval prompts,
quantize calibration sets): the roles every chat template handles, and text content; and how a
record becomes the token ids a model is prompted with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from qlift.errors import IncompatibleError

ChatRole = Literal["system", "user", "assistant"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: ChatRole = Field(description="Who speaks: system, user or assistant.")
    content: str = Field(description="The message text.")


class ChatRecord(BaseModel):
    """A record with a non-empty ``messages`` list (other keys are the caller's to check)."""

    model_config = ConfigDict(extra="ignore")

    messages: list[ChatMessage] = Field(min_length=1, description="The conversation, in order.")


def prompt_token_ids(tokenizer: Any, record: Mapping[str, Any]) -> list[int]:
    """A record's prompt as token ids: ``messages`` through the model's chat template (with the
    generation prompt, and the record's ``tools`` where it has them), else ``prompt`` as plain text. The
    one rendering eval and batch share."""
    messages = record.get("messages")
    if messages is not None:
        if not getattr(tokenizer, "chat_template", None):
            raise IncompatibleError("the model has no chat template, so 'messages' cannot be rendered",
                                    hint="Use 'prompt' instead of 'messages' for this model.")
        tools = {"tools": record["tools"]} if record.get("tools") else {}
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **tools)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(record["prompt"])["input_ids"])
