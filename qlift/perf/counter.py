"""Server-side throughput from the server's own ``vllm:generation_tokens_total`` counter.

The benchmark client measures what reached it; the server's counter measures what the engine
generated. Where the two differ, the client (or the network between) is the bottleneck, not the
server. A thread polls ``/metrics`` while a load runs; the rate is the tokens the counter gained
over the polling intervals in which it gained any (idle gaps between levels do not count).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

from qlift import httpclient
from qlift.vllm.client import GENERATION_TOKENS, VllmClient, VllmError, parse_prometheus


def generation_tokens(text: str) -> float | None:
    """The sum of ``vllm:generation_tokens_total`` over its series (engines, models) in a /metrics page."""
    try:
        return parse_prometheus(text, only=(GENERATION_TOKENS,)).generation_tokens
    except ValueError:
        return None


@dataclass
class CounterRate:
    tokens: float  # the counter's gain while polled
    active_s: float  # polling intervals in which it gained
    samples: int

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.active_s if self.active_s > 0 else None


@dataclass
class CounterSampler:
    """Poll ``base_url/metrics`` every ``interval_s`` in a thread, between ``start()`` and ``stop()``."""

    base_url: str
    interval_s: float = 0.5
    points: list[tuple[float, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _poll(self, client: VllmClient) -> None:
        with contextlib.suppress(VllmError):
            value = client.metrics(only=(GENERATION_TOKENS,)).generation_tokens
            if value is not None:
                self.points.append((time.monotonic(), value))

    def _run(self) -> None:
        with httpclient.client(timeout=5.0) as http:
            client = VllmClient(self.base_url, timeout_s=5.0, http=http)
            while not self._stop.is_set():
                self._poll(client)
                self._stop.wait(self.interval_s)
            self._poll(client)

    def start(self) -> CounterSampler:
        self._thread = threading.Thread(target=self._run, name="qlift-counter", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> CounterRate:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return rate(self.points)

    def __enter__(self) -> CounterSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rate(points: list[tuple[float, float]]) -> CounterRate:
    tokens = active = 0.0
    for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        if v1 > v0:
            tokens += v1 - v0
            active += t1 - t0
    return CounterRate(tokens, active, len(points))
