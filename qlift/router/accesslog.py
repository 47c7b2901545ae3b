"""One JSON line per client request: who, where it went, what came back, how fast."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import IO, Any


class AccessLog:
    """Writes to a file (appending, line-buffered), to stderr for ``-``, or nowhere for ``''``."""

    def __init__(self, target: str) -> None:
        self._own = False
        self._out: IO[str] | None
        if target == "-":
            self._out = sys.stderr
        elif target:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            self._out = open(target, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in close()
            self._own = True
        else:
            self._out = None

    def write(self, **fields: Any) -> None:
        if self._out is None:
            return
        line = json.dumps({"time": round(time.time(), 6), **fields}, separators=(",", ":"))
        self._out.write(line + "\n")

    def close(self) -> None:
        if self._own and self._out is not None:
            self._out.close()
        self._out = None
