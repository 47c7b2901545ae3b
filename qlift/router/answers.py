"""Answer samples in the request log: what the rollout's answer checks read in split windows.

For a sampled completion request the record carries ``answer``: the user's message (its last
user turn, capped), the system prompt (every system message's text, capped; absent when there is
none), the request's ``response_format`` of any type (small ones only), and the answer's text
(capped). Only the newest records keep theirs, bounded in count and in their measured memory
(``memsize.deep_size``: a response_format of many tiny JSON values costs far more than its JSON),
so a busy router holds at most ``MAX_BYTES`` of them whatever clients send.
"""

from __future__ import annotations

import json
import random
from collections import deque
from typing import Any

from qlift.router.memsize import deep_size
from qlift.router.wire import AnswerRecord

PROMPT_CHARS = 2000
SYSTEM_CHARS = 2000  # the system prompt (all system messages, joined by "\n") at most
TEXT_CHARS = 8000
MAX_SCHEMA_BYTES = 16 * 1024
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


def sample(body: dict[str, Any], text: str) -> dict[str, Any]:
    """What a record keeps of a sampled request and its answer: ``prompt``, ``text``, ``system`` (when there is
    one) and ``response_format`` (any type, when its JSON is at most MAX_SCHEMA_BYTES)."""
    fmt = body.get("response_format")
    kept = isinstance(fmt, dict) and len(json.dumps(fmt)) <= MAX_SCHEMA_BYTES
    record = AnswerRecord(prompt=user_message(body), text=text[:TEXT_CHARS], system=system_message(body) or None,
                          response_format=fmt if kept else None)
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

    def attach(self, record: dict[str, Any], body: dict[str, Any], text: str) -> None:
        record["answer"] = s = sample(body, text)
        for old in self.kept.add(record, deep_size(s)):
            old.pop("answer", None)
