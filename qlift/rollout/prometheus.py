"""The Prometheus analysis provider: PromQL per evidence field, like an Argo Rollouts
AnalysisTemplate. Queries are data (spec ``prometheus.queries``) over shipped presets;
``$backend`` (the version's name), ``$model`` (its served model name), ``$instance`` (its
server's host:port, the ``instance`` label of a scrape) and ``$window`` (the analysis interval,
e.g. ``30s``) are filled in. A query should return one number; several series are summed; an
empty answer or NaN means "no data". The preset defaults to the data plane's (see planes.py);
a window whose queries find no series at all for a version says so in its notes.
"""

from __future__ import annotations

import logging
import math
import time
from string import Template

import httpx

from qlift import httpclient
from qlift.errors import BadInputError, ExternalToolError
from qlift.rollout.evidence import VersionEvidence
from qlift.rollout.planes import SourceName
from qlift.rollout.spec import PrometheusSpec

log = logging.getLogger(__name__)

_R = 'backend="$backend"'
_ROUTER_HIST = 'histogram_quantile({q}, sum by (le) (rate(qlift_router_{name}_bucket{{' + _R + '}}[$window])))'

PRESETS: dict[str, dict[str, str]] = {
    # The qlift router's own series (issue 11's /metrics), labelled by backend name.
    "router": {
        "requests": f"sum(increase(qlift_router_requests_total{{{_R}}}[$window]))",
        "errors": f'sum(increase(qlift_router_requests_total{{{_R},status_class=~"5xx|error"}}[$window]))',
        "latency_p50": _ROUTER_HIST.format(q=0.5, name="request_duration_seconds"),
        "latency_p95": _ROUTER_HIST.format(q=0.95, name="request_duration_seconds"),
        # TTFT of streamed requests (a router that labels stream; without the label every series matches)
        "ttft_p50": _ROUTER_HIST.format(q=0.5, name="ttfb_seconds").replace(_R, _R + ',stream!="false"'),
        "ttft_p95": _ROUTER_HIST.format(q=0.95, name="ttfb_seconds").replace(_R, _R + ',stream!="false"'),
        "finishes": f"sum(increase(qlift_router_finish_reason_total{{{_R}}}[$window]))",
        "length_finishes": f'sum(increase(qlift_router_finish_reason_total{{{_R},reason="length"}}[$window]))',
        "completions": f"sum(increase(qlift_router_finish_reason_total{{{_R}}}[$window]))",
        "completion_tokens": f"sum(increase(qlift_router_completion_tokens_total{{{_R}}}[$window]))",
        "empty": f"sum(increase(qlift_router_empty_completions_total{{{_R}}}[$window]))",
    },
    # vLLM's own series, labelled by served model name: no HTTP errors (the engine never sees them).
    "vllm": {
        "requests": 'sum(increase(vllm:request_success_total{model_name="$model"}[$window]))',
        "latency_p50": 'histogram_quantile(0.5, sum by (le) '
                       '(rate(vllm:e2e_request_latency_seconds_bucket{model_name="$model"}[$window])))',
        "latency_p95": 'histogram_quantile(0.95, sum by (le) '
                       '(rate(vllm:e2e_request_latency_seconds_bucket{model_name="$model"}[$window])))',
        "ttft_p50": 'histogram_quantile(0.5, sum by (le) '
                    '(rate(vllm:time_to_first_token_seconds_bucket{model_name="$model"}[$window])))',
        "ttft_p95": 'histogram_quantile(0.95, sum by (le) '
                    '(rate(vllm:time_to_first_token_seconds_bucket{model_name="$model"}[$window])))',
        "finishes": 'sum(increase(vllm:request_success_total{model_name="$model"}[$window]))',
        "length_finishes": 'sum(increase(vllm:request_success_total{model_name="$model",finished_reason="length"}'
                           '[$window]))',
        "completions": 'sum(increase(vllm:request_success_total{model_name="$model"}[$window]))',
        "completion_tokens": 'sum(increase(vllm:generation_tokens_total{model_name="$model"}[$window]))',
    },
}

def _by_instance(preset: dict[str, str]) -> dict[str, str]:
    """vLLM's series picked by scrape target: behind nginx both versions serve the client's one model name."""
    return {k: q.replace('model_name="$model"', 'instance="$instance"') for k, q in preset.items()}


PRESETS["nginx"] = _by_instance(PRESETS["vllm"])
FIELDS = ("requests", "errors", "latency_p50", "latency_p95", "ttft_p50", "ttft_p95", "finishes",
          "length_finishes", "completions", "completion_tokens", "empty")


def queries_for(spec: PrometheusSpec) -> dict[str, str]:
    unknown = sorted(set(spec.queries) - set(FIELDS))
    if unknown:
        raise BadInputError(f"unknown query name(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}",
                            field="prometheus.queries")
    return {**PRESETS[spec.preset or "router"], **spec.queries}


def label_value(value: str) -> str:
    """``value`` escaped for a PromQL double-quoted string (a label matcher's value): a model
    directory named with a quote or a backslash must not end the string early."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def window_label(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


class PrometheusSource:
    name: str = SourceName.PROMETHEUS

    def __init__(self, spec: PrometheusSpec, versions: list[str], models: dict[str, str], window_s: float,
                 instances: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.url = spec.url.rstrip("/")
        self.versions = versions
        self.models = models
        self.instances = instances or {}
        self.window_s = window_s
        self.queries = queries_for(spec)
        self.notes: list[str] = []  # of the last collect: what the window record should say
        self.series = 0  # series the last query returned

    def begin(self) -> None:
        pass  # Prometheus keeps the history; the window is the query's range

    def peek(self) -> None:
        return None  # the queries' range is the whole window

    def query(self, promql: str, at: float | None = None) -> float | None:
        """One instant query, evaluated at ``at`` (Unix seconds; Prometheus's now when None)."""
        params: dict[str, str | float] = {"query": promql}
        if at is not None:
            params["time"] = round(at, 3)
        try:
            resp = httpclient.get(f"{self.url}/api/v1/query", params=params, timeout=self.spec.timeout_s)
        except httpx.HTTPError as exc:
            raise ExternalToolError(f"Prometheus at {self.url} did not answer: {exc}", tool="prometheus") from exc
        body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
        if resp.status_code != 200 or body.get("status") != "success":
            raise BadInputError(f"Prometheus refused query {promql!r}: {body.get('error') or resp.text[:200]}",
                                field="prometheus.queries")
        data = body["data"]
        if data["resultType"] == "scalar":
            values = [float(data["result"][1])]
        else:
            values = [float(s["value"][1]) for s in data["result"]]
        self.series = len(values)
        values = [v for v in values if not math.isnan(v)]
        return sum(values) if values else None

    def collect(self) -> dict[str, VersionEvidence]:
        out: dict[str, VersionEvidence] = {}
        self.notes = []
        window = window_label(self.window_s)
        at = time.time()  # every query of the window at one instant: a scrape between two must not skew them
        for version in self.versions:
            subst = {"backend": label_value(version), "model": label_value(self.models.get(version, version)),
                     "window": window, "instance": label_value(self.instances.get(version, version))}
            got: dict[str, float | None] = {}
            series = 0
            for name, q in self.queries.items():
                got[name] = self.query(Template(q).safe_substitute(subst), at)
                series += self.series
            if series == 0:
                note = (f"prometheus: no series at all for {version} (preset {self.spec.preset}, "
                        f"{', '.join(f'{k}={v}' for k, v in subst.items())}): is Prometheus scraping it, "
                        f"and is the preset the data plane's?")
                log.warning("%s", note)
                self.notes.append(note)
            ev = VersionEvidence(version)
            ev.requests = round(got.get("requests") or 0)
            counts = {k: (None if got.get(k) is None and k not in self.queries else round(got.get(k) or 0))
                      for k in ("errors", "finishes", "length_finishes", "completions", "empty")}
            # increase() extrapolates each series on its own, so a part can come out larger than its whole
            # (seen: 71 answers cut at max_tokens of 46 finished, a share of 1.54): a part is at most its whole.
            ev.errors, ev.finishes = counts["errors"], counts["finishes"]
            ev.length_finishes = _at_most(counts["length_finishes"], ev.finishes)
            ev.completions, ev.empty = counts["completions"], _at_most(counts["empty"], counts["completions"])
            if "completion_tokens" in self.queries:
                ev.completion_tokens_sum = got.get("completion_tokens") or 0.0
            ev.quantiles = {k: got[k] for k in ("latency_p50", "latency_p95", "ttft_p50", "ttft_p95") if k in got}
            out[version] = ev
        return out


def _at_most(part: int | None, whole: int | None) -> int | None:
    return part if part is None or whole is None else min(part, whole)
