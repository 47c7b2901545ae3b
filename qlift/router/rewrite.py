"""What the router changes in answers on their way to the client: the backend's model name
becomes the public one, and a usage chunk the router asked for (not the client) is dropped.

Byte-level, not a JSON round trip per chunk: a stream's chunks are relayed at token rate, and
replacing ``"model":"<served>"`` costs a ``bytes.replace`` where parsing would cost a
``json.loads`` and a ``json.dumps`` per token. vLLM writes compact JSON; the spaced form
``"model": "<served>"`` is handled too.
"""

from __future__ import annotations

import json


def _quoted(name: str) -> bytes:
    return json.dumps(name, ensure_ascii=False).encode()


class ModelRewriter:
    """Replaces the served model name with the public one wherever ``"model"`` names it."""

    def __init__(self, served: str | None, public: str | None) -> None:
        self.pairs: list[tuple[bytes, bytes]] = []
        if served and public and served != public:
            s, p = _quoted(served), _quoted(public)
            self.pairs = [(b'"model":' + s, b'"model":' + p), (b'"model": ' + s, b'"model": ' + p)]

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def __call__(self, data: bytes) -> bytes:
        for old, new in self.pairs:
            if old in data:
                data = data.replace(old, new)
        return data


def is_usage_only(line: bytes) -> bool:
    """An SSE ``data:`` line holding the final usage chunk (``"choices":[]`` plus ``"usage"``)."""
    return (b'"choices":[]' in line or b'"choices": []' in line) and b'"usage"' in line
