"""vLLM's own /metrics for each backend: the engine's view of the same window.

Two scrapes (window start and end) give counter and histogram deltas: requests finished,
finish reasons, generated tokens, TTFT / time per output token / e2e (mean and p95 from the
histogram buckets), preemptions; and the queue depth at the end.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Any

from qlift.rollout.evidence import VersionEvidence
from qlift.vllm.client import Metrics, VllmClient, VllmError, parse_prometheus

log = logging.getLogger(__name__)

Snapshot = dict[tuple[str, tuple[tuple[str, str], ...]], float]
_IGNORED_LABELS = {"model_name", "engine"}
_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}


# Only the families read here (vLLM's /metrics is large).
_WANTED = ("vllm:request_success", "vllm:generation_tokens", "vllm:num_preemptions", "vllm:num_requests_waiting",
           "vllm:num_requests_running", *_HISTOGRAMS.values())


def _snapshot(metrics: Metrics) -> Snapshot:
    """Samples summed over the labels that only name the model or engine."""
    out: Snapshot = defaultdict(float)
    for s in metrics.samples:
        labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in _IGNORED_LABELS))
        out[(s.name, labels)] += s.value
    return dict(out)


def parse_metrics(text: str) -> Snapshot:
    return _snapshot(parse_prometheus(text, only=_WANTED))


_warned: set[str] = set()


def scrape(url: str, timeout: float = 5.0) -> Snapshot | None:
    try:
        return _snapshot(VllmClient(url, timeout_s=timeout).metrics(only=_WANTED))
    except VllmError as exc:
        if url not in _warned:  # once per backend, not every window
            _warned.add(url)
            why = next(iter(exc.reason.splitlines()), type(exc.cause).__name__)
            log.warning("no vLLM metrics from %s (the evidence goes without them): %s", url, why)
        return None


def _total(snap: Snapshot, name: str, **match: str) -> float:
    return sum(v for (n, labels), v in snap.items()
               if n == name and all(dict(labels).get(k) == want for k, want in match.items()))


def _delta(end: Snapshot, start: Snapshot, name: str, **match: str) -> float:
    return max(0.0, _total(end, name, **match) - _total(start, name, **match))


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            width = count - prev_count
            return prev_bound + (bound - prev_bound) * ((rank - prev_count) / width if width else 1.0)
        prev_bound, prev_count = bound, count
    return prev_bound


def _bucket_delta(end: Snapshot, start: Snapshot, name: str) -> list[tuple[float, float]]:
    per_le: dict[float, float] = defaultdict(float)
    for (n, labels), v in end.items():
        if n == f"{name}_bucket":
            le = dict(labels).get("le")
            if le is not None:
                per_le[float(le)] += v - start.get((n, labels), 0.0)
    return sorted(per_le.items())


def window_metrics(start: Snapshot, end: Snapshot) -> dict[str, float | None]:
    """The numbers one backend's engine reports for the window between two scrapes."""
    out: dict[str, float | None] = {}
    success = _delta(end, start, "vllm:request_success_total")
    out["requests"] = success
    out["length_finishes"] = _delta(end, start, "vllm:request_success_total", finished_reason="length")
    out["generation_tokens"] = _delta(end, start, "vllm:generation_tokens_total")
    out["preemptions"] = _delta(end, start, "vllm:num_preemptions_total")
    out["queue_depth"] = _total(end, "vllm:num_requests_waiting")
    out["running"] = _total(end, "vllm:num_requests_running")
    for key, name in _HISTOGRAMS.items():
        count = _delta(end, start, f"{name}_count")
        total = _delta(end, start, f"{name}_sum")
        out[f"{key}_mean"] = total / count if count else None
        buckets = _bucket_delta(end, start, name)
        for q in (0.5, 0.95):
            out[f"{key}_p{round(q * 100)}"] = histogram_quantile(buckets, q) if count else None
    return out


class VllmMetricsReader:
    """Scrapes every backend at the start and end of a window."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self._start: dict[str, Snapshot | None] = {}

    def begin(self) -> None:
        self._start = {v: scrape(u) for v, u in self.urls.items()}

    def collect(self) -> dict[str, dict[str, float | None]]:
        out: dict[str, dict[str, float | None]] = {}
        for version, url in self.urls.items():
            start, end = self._start.get(version), scrape(url)
            if start is not None and end is not None:
                out[version] = window_metrics(start, end)
        return out


def fill_from_vllm(ev: VersionEvidence, metrics: dict[str, Any]) -> None:
    """Attach the engine's numbers; where the primary source had nothing, use them as evidence."""
    ev.vllm = dict(metrics)
    if ev.requests == 0 and ev.errors is None and metrics.get("requests"):
        ev.requests = int(metrics["requests"])
    if ev.finishes is None and metrics.get("requests"):
        ev.finishes = int(metrics["requests"])
        ev.length_finishes = int(metrics.get("length_finishes") or 0)
    if ev.completions is None and metrics.get("requests"):
        ev.completions = int(metrics["requests"])
        ev.completion_tokens_sum = float(metrics.get("generation_tokens") or 0.0)
    for kind, key in (("latency", "e2e"), ("ttft", "ttft")):
        if (ev.latency_s if kind == "latency" else ev.ttft_s):
            continue
        for q in ("p50", "p95"):
            if ev.quantiles.get(f"{kind}_{q}") is None:
                ev.quantiles[f"{kind}_{q}"] = metrics.get(f"{key}_{q}")
