"""One chat message, as every file qlift reads chat records from spells it (eval prompts,
quantize calibration sets): the roles every chat template handles, and text content."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ChatRole = Literal["system", "user", "assistant"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: ChatRole = Field(description="Who speaks: system, user or assistant.")
    content: str = Field(description="The message text.")


class ChatRecord(BaseModel):
    """A record with a non-empty ``messages`` list (other keys are the caller's to check)."""

    model_config = ConfigDict(extra="ignore")

    messages: list[ChatMessage] = Field(min_length=1, description="The conversation, in order.")
