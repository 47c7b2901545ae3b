"""Which backend gets a request: weighted, or sticky by session key over the same weights.

Without a session key, smooth weighted round-robin splits traffic in exact proportion.

A session key hashes to a fixed point in [0, 100); the backends' weights lay out
consecutive ranges over [0, 100) in their configured order, and the key goes to the
backend whose range holds its point. Moving weight 10 -> 20 from the first backend to
the second moves only the keys in the shifted slice; every other session stays put.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass
class Backend:
    name: str
    url: str
    served_model: str | None
    weight: int
    healthy: bool = True
    in_flight: int = 0
    requests: int = 0
    errors: int = 0
    health_failures: int = 0

    def state(self) -> dict[str, object]:
        return {"name": self.name, "url": self.url, "served_model": self.served_model or "",
                "weight": self.weight, "healthy": self.healthy, "in_flight": self.in_flight,
                "requests": self.requests, "errors": self.errors}


def key_point(key: str) -> float:
    """A session key's fixed place in [0, 100)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 * 100.0


class Balancer:
    """Backends in configured order plus the current weights (replaced atomically)."""

    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends
        self.by_name = {b.name: b for b in backends}
        self._current = {b.name: 0 for b in backends}  # smooth weighted round-robin state

    @property
    def weights(self) -> dict[str, int]:
        return {b.name: b.weight for b in self.backends}

    def set_weights(self, weights: dict[str, int]) -> None:
        # One synchronous pass on the event loop: no request sees half the change.
        for b in self.backends:
            b.weight = weights.get(b.name, 0)
            self._current[b.name] = 0

    def _routable(self, b: Backend, exclude: set[str]) -> bool:
        return b.healthy and b.served_model is not None and b.name not in exclude

    def choose(self, session_key: str | None = None,
               exclude: set[str] | frozenset[str] = frozenset()) -> Backend | None:
        """The backend for a new request, or None when no healthy backend is left."""
        exclude = set(exclude)
        if session_key is not None:
            point = key_point(session_key)
            edge = 0.0
            for b in self.backends:
                edge += b.weight
                if point < edge:
                    if self._routable(b, exclude):
                        return b
                    break
        candidates = [b for b in self.backends if self._routable(b, exclude) and b.weight > 0]
        if candidates:
            return self._smooth_round_robin(candidates)
        # Every backend with weight is down or excluded: a healthy zero-weight one beats a 503.
        spare = [b for b in self.backends if self._routable(b, exclude)]
        return min(spare, key=lambda b: b.in_flight) if spare else None

    def _smooth_round_robin(self, candidates: list[Backend]) -> Backend:
        # nginx's smooth weighted round-robin: exact shares over any window, well interleaved
        # (random draws would put a 50/50 split outside +-5 points over 400 requests 5% of the time).
        total = 0
        for b in candidates:
            self._current[b.name] += b.weight
            total += b.weight
        best = max(candidates, key=lambda b: self._current[b.name])
        self._current[best.name] -= total
        return best

    def any_healthy(self) -> bool:
        return any(self._routable(b, set()) for b in self.backends)
