"""The PromQL forms of the judge's checks: what `qlift deploy k8s --rollout argo` writes into an Argo
``AnalysisTemplate`` for each entry of ``checks.CHECKS`` that has one (a query whose one value the success
and failure conditions read, bound to the AnalysisRun's arguments)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from string import Template

from qlift.rollout.spec import AnalysisSpec


@dataclass(frozen=True)
class PromqlMetric:
    """One Argo metric: a query whose one value the success / failure conditions read."""

    name: str
    check: str  # the judge's check it mirrors
    query: str
    success: str
    failure: str


@dataclass(frozen=True)
class Promql:
    """A preset's queries bound to an AnalysisRun's arguments ({{args.canary}} ...)."""

    preset: dict[str, str]
    window: str

    def has(self, *fields: str) -> bool:
        return all(f in self.preset for f in fields)

    def q(self, field: str, role: str) -> str:
        return "(" + Template(self.preset[field]).safe_substitute(
            backend=f"{{{{args.{role}}}}}", model=f"{{{{args.{role}-model}}}}",
            instance=f"{{{{args.{role}-instance}}}}", window=self.window) + ")"

    def share(self, num: str, den: str, role: str) -> str:
        return f"({self.q(num, role)} / {self.q(den, role)})"


ArgoForm = Callable[[Promql, AnalysisSpec], list[PromqlMetric]]


def _limit(value: float) -> tuple[str, str]:
    return f"len(result) > 0 && result[0] <= {value}", f"len(result) > 0 && result[0] > {value}"


def _share_ratio(p: Promql, num: str, den: str, a: AnalysisSpec) -> str:
    c, s = p.share(num, den, "canary"), p.share(num, den, "stable")
    return f"({c} / clamp_min({s}, 1e-9)) * (({c} - {s}) >= bool {a.min_share_increase})"


def argo_requests(p: Promql, a: AnalysisSpec) -> list[PromqlMetric]:
    return [PromqlMetric("canary-requests", "canary_requests", p.q("requests", "canary"),
                         f"len(result) > 0 && result[0] >= {a.min_requests}", "false")]


def argo_errors(p: Promql, a: AnalysisSpec) -> list[PromqlMetric]:
    if not p.has("errors", "requests"):
        return []
    return [PromqlMetric("error-rate", "error_rate", f"{p.q('errors', 'canary')} / {p.q('requests', 'canary')}",
                         *_limit(a.max_error_rate))]


def argo_latency(kind: str, metric: str, limit_field: str, tolerance_field: str) -> ArgoForm:
    def form(p: Promql, a: AnalysisSpec) -> list[PromqlMetric]:
        field = f"{kind}_p{round(a.latency_quantile * 100)}"
        if not p.has(field):
            from qlift.errors import BadInputError

            raise BadInputError(f"the preset has no {field} query", field="analysis.latency_quantile",
                                hint="Use latency_quantile 0.5 or 0.95.")
        c, s = p.q(field, "canary"), p.q(field, "stable")
        # canary/stable, zeroed while the canary is within the tolerance of the stable (a pass)
        query = f"({c} / clamp_min({s}, 1e-9)) * (({c} - {s}) > bool {getattr(a, tolerance_field)})"
        return [PromqlMetric(metric, kind, query, *_limit(getattr(a, limit_field)))]
    return form


def argo_finish_length(p: Promql, a: AnalysisSpec) -> list[PromqlMetric]:
    if not p.has("length_finishes", "finishes"):
        return []
    return [PromqlMetric("finish-length-share-ratio", "finish_length",
                         _share_ratio(p, "length_finishes", "finishes", a), *_limit(a.max_length_share_ratio))]


def argo_tokens(p: Promql, a: AnalysisSpec) -> list[PromqlMetric]:
    if not p.has("completion_tokens", "completions"):
        return []
    ratio = f"({p.share('completion_tokens', 'completions', 'canary')} / " \
            f"{p.share('completion_tokens', 'completions', 'stable')})"
    if p.has("length_finishes", "finishes"):
        # Below 1 the ratio is divided by the stable's uncut share (and capped at 1), so one
        # condition checks ratio >= min_tokens_ratio * (1 - stable cut share), as quiet_limit does.
        uncut = f"clamp_min(1 - {p.share('length_finishes', 'finishes', 'stable')}, 1e-9)"
        ratio = f"(({ratio} >= 1) or clamp_max({ratio} / {uncut}, 1))"
    lo, hi = a.min_tokens_ratio, a.max_tokens_ratio
    return [PromqlMetric("completion-tokens-ratio", "completion_tokens", ratio,
                         f"len(result) > 0 && result[0] >= {lo} && result[0] <= {hi}",
                         f"len(result) > 0 && (result[0] < {lo} || result[0] > {hi})")]


def argo_empty(p: Promql, a: AnalysisSpec) -> list[PromqlMetric]:
    if not p.has("empty", "completions"):
        return []
    return [PromqlMetric("empty-share-ratio", "empty_completions", _share_ratio(p, "empty", "completions", a),
                         *_limit(a.max_empty_share_ratio))]
