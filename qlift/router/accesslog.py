"""One JSON line per client request: who, where it went, what came back, how fast."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import IO, Any

from qlift.errors import BadInputError, NotFoundError


class AccessLog:
    """Writes to a file (appending, line-buffered), to stderr for ``-``, or nowhere for ``''``."""

    def __init__(self, target: str) -> None:
        self._own = False
        self._out: IO[str] | None
        if target == "-":
            self._out = sys.stderr
        elif target:
            path = Path(target)
            if not path.parent.is_dir():
                raise NotFoundError(f"the directory of access_log {path} does not exist",
                                    hint="Create it, or point access_log at an existing directory ('-' = stderr).")
            try:
                self._out = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in close()
            except OSError as exc:
                raise BadInputError(f"cannot open access_log {path}: {exc.strerror or exc}",
                                    hint="Point access_log at a writable file ('-' = stderr, '' = off).") from None
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
