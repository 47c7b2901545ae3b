"""What a kept JSON-like value costs in memory, not in JSON: what the router's bounded stores count.

A value's JSON understates it: ``{"role": "user", "content": "a"}`` is 32 bytes of JSON and ~300 bytes
of dict and strings; ``[{}, {}, ...]`` is 4 bytes of JSON and ~70 bytes of memory an element. Stores
bounded by JSON bytes grew ~2 MiB a shadowed request of many tiny messages (issue 43).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def deep_size(value: Any) -> int:
    """Bytes of ``value`` and of every dict, list, string and number in it (sys.getsizeof, summed; shared
    objects such as small ints and None counted each time, so it errs high), without recursion."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


def compact_json(value: Any) -> bytes:
    """UTF-8 JSON without spaces (CJK at 3 bytes a character, not 6); escaped ASCII when a lone surrogate
    (valid in a client's JSON escapes, not in UTF-8) is in it."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()
