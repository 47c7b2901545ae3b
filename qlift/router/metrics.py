"""The router's Prometheus series, on a registry of its own (label ``backend`` = backend name)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
# Seconds per output token: 1 ms (a fast GPU's decode) to 2.5 s (a loaded CPU's, or a long prompt over few tokens).
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5)
TTFB_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


def status_class(status: int, broken: bool = False) -> str:
    """2xx/4xx/5xx, or ``error`` for no answer (connection error, timeout) or a stream cut short."""
    if status == 0 or broken:
        return "error"
    return f"{status // 100}xx"


def token_latency(latency_s: float, ttfb_s: float | None, tokens: int | None, stream: bool) -> float | None:
    """Seconds per output token, as promote's judge compares it: a stream's decode time over the tokens after
    its first (TPOT), else the whole answer's time over all its tokens; None without tokens."""
    if not tokens:
        return None
    if stream and tokens > 1 and ttfb_s is not None:
        return (latency_s - ttfb_s) / (tokens - 1)
    return latency_s / tokens


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("qlift_router_requests", "Upstream attempts by backend and status class.",
                                ["backend", "status_class"], registry=r)
        # stream="true"|"false": a stream's first byte is its first token, a non-streamed one's the whole answer.
        self.duration = Histogram("qlift_router_request_duration_seconds", "End-to-end time of an attempt.",
                                  ["backend", "stream"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttfb = Histogram("qlift_router_ttfb_seconds", "Time to the backend's first body byte.",
                              ["backend", "stream"], buckets=TTFB_BUCKETS, registry=r)
        self.token_latency = Histogram("qlift_router_token_latency_seconds", "Time per output token of a successful "
                                       "answer, as promote's judge takes it (token_latency).", ["backend", "stream"],
                                       buckets=TOKEN_BUCKETS, registry=r)
        self.completion_tokens = Counter("qlift_router_completion_tokens", "Completion tokens (from usage).",
                                         ["backend"], registry=r)
        self.finish_reason = Counter("qlift_router_finish_reason", "Choices by finish_reason.",
                                     ["backend", "reason"], registry=r)
        self.empty_completions = Counter("qlift_router_empty_completions", "Successful answers with 0 tokens.",
                                         ["backend"], registry=r)
        self.in_flight = Gauge("qlift_router_in_flight", "Requests now on the backend.", ["backend"], registry=r)
        self.retries = Counter("qlift_router_retries", "Failed attempts on this backend replayed elsewhere.",
                               ["backend"], registry=r)
        self.healthy = Gauge("qlift_router_backend_healthy", "1 when the backend is in rotation.", ["backend"],
                             registry=r)
        self.weight = Gauge("qlift_router_weight", "Percent of new traffic.", ["backend"], registry=r)
        self.failures = Counter("qlift_router_failures", "Failed attempts by reason: http_5xx, connect, timeout, "
                                "bad_body, no_choices, error_object, no_done, error_event, stream_broke, ...",
                                ["backend", "reason"], registry=r)
        self.shadow = Counter("qlift_router_shadow", "Shadow copies by outcome: ok, failed, dropped.",
                              ["backend", "outcome"], registry=r)
        self.rejected = Counter("qlift_router_rejected", "Requests refused before any backend.",
                                ["key", "reason"], registry=r)
        self.filter_reload_failures = Counter("qlift_router_filter_reload_failures", "Filter file reloads refused "
                                              "(unreadable, not UTF-8, bad pattern, emptied): old rules kept.",
                                              registry=r)
        self.answers_filtered = Counter("qlift_router_answers_filtered", "Answers the content filter cut before a "
                                        "blocked word (finish_reason content_filter), by backend.", ["backend"],
                                        registry=r)
        self.connections_refused = Counter("qlift_router_connections_refused", "Client connections over "
                                           "server.max_connections, answered 503.", registry=r)
        self.client_timeouts = Counter("qlift_router_client_timeouts", "Client requests too slow to arrive, by "
                                       "phase: header, body (408).", ["phase"], registry=r)

    def init_backend(self, name: str, weight: int, healthy: bool) -> None:
        """Create a backend's series at zero so dashboards and rate() see them from the start."""
        for cls in ("2xx", "4xx", "5xx", "error"):
            self.requests.labels(name, cls)
        for stream in ("true", "false"):
            self.duration.labels(name, stream)
            self.ttfb.labels(name, stream)
            self.token_latency.labels(name, stream)
        self.completion_tokens.labels(name)
        self.empty_completions.labels(name)
        self.retries.labels(name)
        self.answers_filtered.labels(name)
        self.in_flight.labels(name).set(0)
        self.healthy.labels(name).set(int(healthy))
        self.weight.labels(name).set(weight)

    def render(self) -> bytes:
        return generate_latest(self.registry)
