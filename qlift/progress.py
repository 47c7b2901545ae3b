"""Progress bars for long work, on stderr, only when it is a terminal.

Library code calls ``bar``; the CLI turns bars off for ``--quiet`` via ``set_enabled``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)
_enabled = True


def set_enabled(value: bool) -> None:
    global _enabled
    _enabled = value


def enabled() -> bool:
    """Whether bars are shown: not --quiet, and stderr is a terminal."""
    return _enabled and sys.stderr.isatty()


def bar(iterable: Iterable[T], *, total: int | None = None, desc: str = "", unit: str = "it") -> Iterator[T]:
    if not enabled():
        yield from iterable
        return
    from tqdm import tqdm

    yield from tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)


def counter(total: int, desc: str = "", unit: str = "it", **kwargs: object):  # type: ignore[no-untyped-def]
    """A bar to ``.update(n)`` by hand (thread-safe), then ``.close()``; a no-op when disabled."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, disable=not enabled(), **kwargs)


def byte_bar(total: int, desc: str = ""):  # type: ignore[no-untyped-def]
    """A bytes progress bar (call ``.update(n)``, then ``.close()``); a no-op when disabled."""
    return counter(total, desc, unit="B", unit_scale=True, unit_divisor=1024)


class StepBar:
    """A bar fed ``update(done, total)`` by a callback that learns the total only at its first
    step (AWQ's per-layer progress); a no-op when bars are off."""

    def __init__(self, desc: str, unit: str = "it") -> None:
        self.desc, self.unit = desc, unit
        self._bar: Any = None

    def update(self, done: int, total: int) -> None:
        if self._bar is None:
            self._bar = counter(total, self.desc, self.unit)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class ProgressLines:
    """Progress as log lines, for when no bar can be drawn (stderr is a file or a pipe): one line per
    tenth done, or every ``every_s`` seconds, whichever comes first; --quiet hides them with the logs.
    Thread-safe, like a bar."""

    def __init__(self, desc: str, total: int, *, unit: str = "it", every_s: float = 30.0, after_s: float = 0.0
                 ) -> None:
        """``after_s``: say nothing until then (work done sooner needs no progress)."""
        self.desc, self.total, self.unit, self.every_s, self.after_s = desc, total, unit, every_s, after_s
        self.done, self.t0 = 0, time.monotonic()
        self.last_t, self.last_tenth = self.t0, 0
        self._lock = threading.Lock()

    def step(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            tenth = self.done * 10 // max(1, self.total)
            if now - self.t0 < self.after_s:
                return
            if tenth > self.last_tenth or now - self.last_t >= self.every_s or self.done == self.total:
                self.last_t, self.last_tenth = now, tenth
                elapsed = now - self.t0
                left = elapsed / self.done * (self.total - self.done)
                log.info("%s: %d/%d %s (%.0f s, ~%.0f s left)", self.desc, self.done, self.total, self.unit,
                         elapsed, left)

    update = step  # a bar's spelling

    def close(self) -> None:
        pass


def tracker(total: int, desc: str = "", unit: str = "it") -> Any:
    """Something to ``.update(n)`` and ``.close()``: a bar on a terminal, else ProgressLines (log lines, which
    --quiet hides) from 2 s in; nothing shown when bars are off for --quiet."""
    if enabled() or not _enabled:
        return counter(total, desc, unit)
    return ProgressLines(desc, total, unit=unit, after_s=2.0)
