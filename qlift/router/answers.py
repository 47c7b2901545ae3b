"""Answer samples in the request log: what the rollout's answer checks read in split windows.

For a sampled completion request the record carries ``answer``: the user's message (its last
user turn, capped), the request's ``response_format`` when it sends a json_schema (small ones
only), and the answer's text (capped). Only the newest records keep theirs, bounded in count and
bytes, so a busy router holds at most ``MAX_BYTES`` of them whatever clients send.
"""

from __future__ import annotations

import json
import random
from collections import deque
from typing import Any

PROMPT_CHARS = 2000
TEXT_CHARS = 8000
MAX_SCHEMA_BYTES = 16 * 1024
MAX_KEPT = 4000
MAX_BYTES = 32 * 1024 * 1024


def user_message(body: dict[str, Any]) -> str:
    from qlift.quality.registry import user_text

    return user_text(body)[:PROMPT_CHARS]


def sample(body: dict[str, Any], text: str) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt": user_message(body), "text": text[:TEXT_CHARS]}
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        raw = json.dumps(fmt)
        if len(raw) <= MAX_SCHEMA_BYTES:
            out["response_format"] = fmt
    return out


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
        size = len(s["prompt"]) + len(s["text"]) + (len(json.dumps(s["response_format"])) if "response_format" in s
                                                    else 0)
        for old in self.kept.add(record, size):
            old.pop("answer", None)
