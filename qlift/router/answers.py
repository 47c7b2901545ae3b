"""Answer samples in the request log: what the rollout's answer checks read in split windows.

For a sampled completion request the record carries ``answer``: the user's message (its last user
turn, capped), the system prompt (every system message's text, capped; absent when there is none),
the request's ``response_format`` of any type (small ones only), the answer's text (capped), and for
a chat request with tools its tool calls (``proxy.Attempt``'s caps), the tools (``kept_tools``: name
and parameters each) and ``tool_choice``. Only the newest records keep theirs, bounded in count and
in their measured memory (``memsize.deep_size``: a response_format of many tiny JSON values costs
far more than its JSON), so a busy router holds at most ``MAX_BYTES`` of them whatever clients send.
"""

from __future__ import annotations

import json
import random
from collections import deque
from typing import Any

from qlift.router.memsize import deep_size
from qlift.router.wire import AnswerRecord, ToolCall

PROMPT_CHARS = 2000
SYSTEM_CHARS = 2000  # the system prompt (all system messages, joined by "\n") at most
TEXT_CHARS = 8000
MAX_SCHEMA_BYTES = 16 * 1024
TOOLS_KEPT = 64  # a request offering more tools keeps none (its calls are not judged)
TOOL_NAME_CHARS = 64  # OpenAI's own limit on a function name
MAX_KEPT = 4000
MAX_BYTES = 32 * 1024 * 1024


def user_message(body: dict[str, Any]) -> str:
    from qlift.quality.registry import user_text

    return user_text(body)[:PROMPT_CHARS]


def system_message(body: dict[str, Any]) -> str:
    """Every system message's text, joined by a line break, capped: the judge reads what the model was told."""
    from qlift.quality.registry import message_text

    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    parts = [message_text(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "system"]
    return "\n".join(parts)[:SYSTEM_CHARS]


def kept_tools(tools: Any) -> list[dict[str, Any]] | None:
    """A request's function tools as the judge reads them, ``{"type": "function", "function": {"name",
    "parameters"}}`` each (descriptions left out): with their parameters when that JSON is at most
    MAX_SCHEMA_BYTES, else names only (calls are then checked by name and as JSON, not against a schema).
    None without tools, or past TOOLS_KEPT of them."""
    if not isinstance(tools, list) or len(tools) > TOOLS_KEPT:
        return None
    functions: list[dict[str, Any]] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            entry = {"name": fn["name"][:TOOL_NAME_CHARS]}
            if isinstance(fn.get("parameters"), dict):
                entry["parameters"] = fn["parameters"]
            functions.append(entry)
    if len(json.dumps(functions)) > MAX_SCHEMA_BYTES:
        functions = [{"name": f["name"]} for f in functions]
    return [{"type": "function", "function": f} for f in functions] or None


def kept_tool_choice(choice: Any) -> str | dict[str, Any] | None:
    """``tool_choice`` as the judge reads it: "none", "auto", "required", or the named function's name only."""
    if isinstance(choice, str):
        return choice[:TOOL_NAME_CHARS]
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    return {"type": "function", "function": {"name": name[:TOOL_NAME_CHARS]}} if isinstance(name, str) else None


def sample(body: dict[str, Any], text: str, tool_calls: list[ToolCall] | None = None) -> dict[str, Any]:
    """What a record keeps of a sampled request and its answer: ``prompt``, ``text``, ``system`` (when there is
    one), ``response_format`` (any type, when its JSON is at most MAX_SCHEMA_BYTES), and where set the answer's
    ``tool_calls`` and the request's ``tools`` (``kept_tools``) and ``tool_choice``."""
    fmt = body.get("response_format")
    kept = isinstance(fmt, dict) and len(json.dumps(fmt)) <= MAX_SCHEMA_BYTES
    record = AnswerRecord(prompt=user_message(body), text=text[:TEXT_CHARS], system=system_message(body) or None,
                          response_format=fmt if kept else None, tool_calls=tool_calls or None,
                          tools=kept_tools(body.get("tools")), tool_choice=kept_tool_choice(body.get("tool_choice")))
    return record.model_dump(exclude_none=True)


class Bounded:
    """Items oldest first, at most ``count`` of them and ``max_bytes`` of their sizes: ``add`` returns what it
    evicted (the oldest, while over either bound)."""

    def __init__(self, count: int, max_bytes: int) -> None:
        self.count, self.max_bytes = count, max_bytes
        self.items: deque[tuple[Any, int]] = deque()
        self.bytes = 0

    def add(self, item: Any, size: int) -> list[Any]:
        self.items.append((item, size))
        self.bytes += size
        evicted = []
        while self.items and (len(self.items) > self.count or self.bytes > self.max_bytes):
            old, n = self.items.popleft()
            self.bytes -= n
            evicted.append(old)
        return evicted


class AnswerSamples:
    """Which requests keep their answer (``percent`` of completion requests), and the eviction of old ones."""

    def __init__(self, percent: int) -> None:
        self.percent = percent
        self.kept = Bounded(MAX_KEPT, MAX_BYTES)

    def wanted(self) -> bool:
        return self.percent >= 100 or (self.percent > 0 and random.random() * 100 < self.percent)

    def attach(self, record: dict[str, Any], body: dict[str, Any], text: str,
               tool_calls: list[ToolCall] | None = None) -> None:
        record["answer"] = s = sample(body, text, tool_calls)
        for old in self.kept.add(record, deep_size(s)):
            old.pop("answer", None)
