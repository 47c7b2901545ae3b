"""Which backend gets a request: weighted, or sticky by session key over the same weights.

Without a session key, requests are dealt from a shuffled deck holding each backend as many
times as its weight: exact shares over every deck (100 requests at weights summing to 100),
and a random order inside it. Promotion compares the versions on the requests each one got,
so the assignment must not follow any pattern in the traffic: a strict alternation (smooth
round-robin) sends every other request of a client that alternates long and short prompts to
the same version, and the comparison then measures the prompts, not the model.

A session key hashes to a fixed point in [0, 100); the backends' weights lay out
consecutive ranges over [0, 100) in their configured order, and the key goes to the
backend whose range holds its point. Moving weight 10 -> 20 from the first backend to
the second moves only the keys in the shifted slice; every other session stays put.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from qlift.router.config import redact_url
from qlift.router.wire import BackendState


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
    model_listed: bool = False  # its /v1/models listed served_model since it last became healthy
    problem: str | None = None  # why it is out of rotation, beyond a failing /health
    model_hash: str | None = None  # the version's ModelRef content hash, when the config gives it
    served_root: str | None = None  # the `root` (and `parent`) its /v1/models lists for served_model
    # May take users while at weight 0 (only with failover_to_zero_weight): its 0 came from the config, not
    # from the admin API, through which a rollout's shadow phase and its rollback set a canary's 0.
    spare: bool = False
    # Its model was named (URL#MODEL, served_model, or the admin API): a server listing another model leaves it
    # out of rotation. Unpinned, it takes the model its server lists (re-resolved when the server changes model).
    pinned: bool = False
    went_away: bool = False  # its /health failed since its model was last listed (it may come back as another)

    def wire_state(self) -> BackendState:
        return BackendState(name=self.name, url=redact_url(self.url), served_model=self.served_model or "",
                            weight=self.weight, healthy=self.healthy, in_flight=self.in_flight,
                            requests=self.requests, errors=self.errors, problem=self.problem,
                            model_hash=self.model_hash, identity=self.identity)

    def state(self) -> dict[str, object]:
        return self.wire_state().model_dump()

    @property
    def identity(self) -> str | None:
        """What this backend serves, for a rollout to notice a change: the configured hash, else its root."""
        if self.model_hash:
            return f"hash {self.model_hash}"
        return None if self.served_root is None else f"root {self.served_root}"


def key_point(key: str) -> float:
    """A session key's fixed place in [0, 100)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 * 100.0


class Balancer:
    """Backends in configured order plus the current weights (replaced atomically)."""

    def __init__(self, backends: list[Backend], *, failover_to_zero_weight: bool = False) -> None:
        self.backends = backends
        self.failover_to_zero_weight = failover_to_zero_weight
        self.not_spare: set[str] = set()  # never a spare, whatever its weight's origin (the shadow version)
        self.by_name = {b.name: b for b in backends}
        self._deck: list[str] = []
        self._deck_for: tuple[tuple[str, int], ...] = ()  # the candidates and weights the deck was made for
        self._rng = random.Random()

    @property
    def weights(self) -> dict[str, int]:
        return {b.name: b.weight for b in self.backends}

    def set_weights(self, weights: dict[str, int]) -> None:
        # One synchronous pass on the event loop: no request sees half the change.
        for b in self.backends:
            b.weight = weights.get(b.name, 0)
            b.spare = False  # a 0 set through the admin API (a rollout's shadow phase, its rollback) is no spare

    def add(self, backend: Backend) -> None:
        """A new backend, last in order (its session keys' ranges come after the others')."""
        self.backends.append(backend)  # in place: the health checker holds this same list
        self.by_name[backend.name] = backend

    def remove(self, name: str) -> Backend:
        """Take a backend out for good; its requests in flight finish on the object they hold."""
        backend = self.by_name.pop(name)
        self.backends.remove(backend)
        self._deck = []  # a fresh deck for the next request
        return backend

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
            if exclude:  # a replay: leave the deck to first choices
                return self._rng.choices(candidates, weights=[b.weight for b in candidates])[0]
            return self._deal(candidates)
        # Every backend with weight is down or excluded. Weight 0 means no user traffic: the caller answers
        # with the failure (or 503), unless the operator made config-zero backends spares.
        if not self.failover_to_zero_weight:
            return None
        spare = [b for b in self.backends if b.spare and b.name not in self.not_spare and self._routable(b, exclude)]
        return min(spare, key=lambda b: b.in_flight) if spare else None

    def _deal(self, candidates: list[Backend]) -> Backend:
        spec = tuple((b.name, b.weight) for b in candidates)
        if spec != self._deck_for or not self._deck:  # new weights or a backend in or out: a fresh deck
            self._deck = [b.name for b in candidates for _ in range(b.weight)]
            self._rng.shuffle(self._deck)
            self._deck_for = spec
        return self.by_name[self._deck.pop()]

    def any_healthy(self) -> bool:
        return any(self._routable(b, set()) for b in self.backends)
