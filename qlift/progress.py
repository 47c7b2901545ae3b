"""Progress bars for long work, on stderr, only when it is a terminal.

Library code calls ``bar``; the CLI turns bars off for ``--quiet`` via ``set_enabled``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

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
