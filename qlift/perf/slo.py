"""Service-level objectives and goodput.

``--slo ttft=500ms,tpot=50ms,e2e=2s``: a request is good when it succeeded and meets every
objective (TTFT, time per output token after the first, end-to-end latency). Goodput is good
requests per second, and the good requests' output tokens per second, over the level's duration.
vLLM's client computes the same request goodput (``--goodput``); qlift recomputes it from the
per-request records so that it also has the token goodput and works with any vLLM version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qlift.errors import BadInputError

# qlift's names -> vLLM bench serve's names for --goodput
METRICS = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2el", "e2el": "e2el"}
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")


def parse_slo(text: str | None) -> dict[str, float]:
    """``ttft=500ms,tpot=50ms,e2e=2s`` as {vLLM metric name: milliseconds}."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        name = METRICS.get(key.strip().lower())
        m = _VALUE.match(raw)
        if not sep or name is None or m is None:
            raise BadInputError(f"{part.strip()!r} is not NAME=VALUE with NAME ttft, tpot or e2e and VALUE in ms or s",
                                field="slo", hint="Example: `slo` ttft=500ms,tpot=50ms,e2e=10s.")
        if name in slo:
            raise BadInputError(f"{key.strip()!r} is given twice (as {name})", field="slo",
                                hint="Give each of ttft, tpot and e2e once.")
        value = float(m.group(1)) * (1000.0 if m.group(2) == "s" else 1.0)
        if value <= 0:
            raise BadInputError(f"{part.strip()!r}: an objective must be above 0 (no request meets 0 ms)",
                                field="slo", hint="Example: `slo` ttft=500ms,tpot=50ms,e2e=10s.")
        slo[name] = value
    return slo


def vllm_goodput_args(slo: dict[str, float]) -> list[str]:
    """The same objectives as vLLM bench serve's ``--goodput ttft:500 tpot:50`` arguments."""
    return ["--goodput", *(f"{k}:{v:g}" for k, v in slo.items())] if slo else []


@dataclass(frozen=True)
class RequestRecord:
    """One request's outcome, as vLLM's client measured it (seconds)."""

    ok: bool
    ttft: float
    latency: float
    output_tokens: int

    @property
    def tpot(self) -> float:
        """Time per output token after the first; 0 for one-token answers (as vLLM counts it)."""
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


def is_good(r: RequestRecord, slo: dict[str, float]) -> bool:
    values = {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.latency}
    return r.ok and all(values[k] * 1000.0 <= limit for k, limit in slo.items())


@dataclass(frozen=True)
class Goodput:
    good_requests: int
    requests_per_s: float
    output_tokens_per_s: float


def goodput(records: list[RequestRecord], slo: dict[str, float], duration_s: float) -> Goodput:
    """Requests meeting every objective (every successful one without an SLO), per second."""
    good = [r for r in records if is_good(r, slo)]
    d = max(duration_s, 1e-9)
    return Goodput(len(good), len(good) / d, sum(r.output_tokens for r in good) / d)
