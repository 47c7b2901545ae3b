"""Progress bars for long work, on stderr, only when it is a terminal.

Library code calls ``bar``; the CLI turns bars off for ``--quiet`` via ``set_enabled``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
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
