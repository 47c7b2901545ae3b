"""Work spread over threads that never hold up Ctrl-C, SIGTERM or interpreter exit.

``concurrent.futures`` joins its workers on the way out (the ``with`` block, and again at
interpreter exit), so one request stuck on a stalled server kept an interrupted command
alive for minutes. Here the workers are daemon threads: an interrupt stops handing out
work and returns at once; a worker still blocked in a socket read is abandoned and dies
with the process.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_POLL_S = 0.2  # how often the waiting thread wakes up to notice a signal


def map_unordered(fn: Callable[[T], R], items: Sequence[T], *, workers: int, name: str = "qlift-worker",
                  finish_started: bool = False) -> Iterator[tuple[int, R]]:
    """Yield ``(index, fn(item))`` as each finishes, on up to ``workers`` daemon threads.

    The first exception a worker raises is raised here, and no new item starts after it;
    so does leaving the loop early (an exception in the caller, Ctrl-C, ``close()``).
    With ``finish_started`` a worker's exception first waits for the items already started
    (their side effects, such as a download's journal line, are kept; Ctrl-C still cuts it short).
    """
    todo: queue.SimpleQueue[tuple[int, T]] = queue.SimpleQueue()
    done: queue.SimpleQueue[tuple[int, bool, object]] = queue.SimpleQueue()
    stop = threading.Event()
    for pair in enumerate(items):
        todo.put(pair)

    def work() -> None:
        while not stop.is_set():
            try:
                i, item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((i, True, fn(item)))
            except BaseException as exc:  # handed to the caller, who decides
                done.put((i, False, exc))

    threads = [threading.Thread(target=work, name=f"{name}-{k}", daemon=True)
               for k in range(max(1, min(workers, len(items))))]
    for t in threads:
        t.start()
    try:
        for _ in range(len(items)):
            while True:
                try:
                    i, ok, value = done.get(timeout=_POLL_S)
                    break
                except queue.Empty:
                    continue
            if not ok:
                assert isinstance(value, BaseException)
                if finish_started:
                    stop.set()
                    for t in threads:
                        while t.is_alive():
                            t.join(_POLL_S)
                raise value
            yield i, value  # type: ignore[misc]
    finally:
        stop.set()
