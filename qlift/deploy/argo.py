"""Argo Rollouts: a ``Rollout`` (canary 10 -> 50 -> 100 with pauses and analysis) and an
``AnalysisTemplate`` whose Prometheus queries are ``qlift promote``'s own.

Each check of promote's judge becomes one metric. Its query is built from the PromQL preset
``qlift promote --prometheus`` uses (``qlift.rollout.prometheus.PRESETS``) with ``$backend`` /
``$model`` bound to the AnalysisRun's arguments, and its limits and tolerances are the
fields of ``AnalysisSpec``. A query yields a value only when the canary is over its
tolerance, so a success condition ``<= limit`` is the judge's pass; an empty or NaN answer
(no traffic yet) satisfies neither condition, which Argo counts as inconclusive and measures
again one window later, as the judge holds. What Argo cannot do is the judge's significance
tests: an over-limit window fails at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template
from typing import Any

from qlift.errors import BadInputError
from qlift.rollout.prometheus import PRESETS, window_label
from qlift.rollout.spec import AnalysisSpec

ROLLOUT_API = "argoproj.io/v1alpha1"
GATEWAY_PLUGIN = "argoproj-labs/gatewayAPI"  # Argo Rollouts' Gateway API traffic-router plugin
ARGS = ("stable", "canary", "stable-model", "canary-model")


@dataclass
class Check:
    """One metric of the template: a query and the conditions on its one value."""

    name: str
    query: str
    success: str
    failure: str


def _bound(preset: dict[str, str], field: str, role: str, window: str) -> str:
    """The preset's query for ``field`` about ``role`` (stable/canary), as an AnalysisRun evaluates it."""
    return Template(preset[field]).safe_substitute(
        backend=f"{{{{args.{role}}}}}", model=f"{{{{args.{role}-model}}}}", window=window)


def _limit(value: float) -> tuple[str, str]:
    return f"len(result) > 0 && result[0] <= {value}", f"len(result) > 0 && result[0] > {value}"


def checks(preset_name: str, analysis: AnalysisSpec, window_s: float) -> list[Check]:
    """promote's checks, in the judge's order, for the fields the preset has queries for."""
    preset, window = PRESETS[preset_name], window_label(window_s)

    def q(field: str, role: str) -> str:
        return f"({_bound(preset, field, role, window)})"

    def ratio_over(field: str, tolerance: float, cmp: str) -> str:
        # canary/stable, zeroed while the canary is within ``tolerance`` of the stable (a pass)
        c, s = q(field, "canary"), q(field, "stable")
        return f"({c} / clamp_min({s}, 1e-9)) * (({c} - {s}) {cmp} bool {tolerance})"

    def share(num: str, den: str, role: str) -> str:
        return f"({q(num, role)} / {q(den, role)})"

    out = [Check("canary-requests", q("requests", "canary"),
                 f"len(result) > 0 && result[0] >= {analysis.min_requests}", "false")]
    if "errors" in preset:
        out.append(Check("error-rate", f"{q('errors', 'canary')} / {q('requests', 'canary')}",
                         *_limit(analysis.max_error_rate)))
    quantile = f"p{round(analysis.latency_quantile * 100)}"
    for check, field, limit in (("latency-ratio", f"latency_{quantile}", analysis.max_latency_ratio),
                                ("ttft-ratio", f"ttft_{quantile}", analysis.max_ttft_ratio)):
        if field not in preset:
            raise BadInputError(f"the {preset_name} preset has no {field} query", field="analysis.latency_quantile",
                                hint="Use latency_quantile 0.5 or 0.95.")
        out.append(Check(check, ratio_over(field, analysis.min_latency_increase_s, ">"), *_limit(limit)))
    if {"length_finishes", "finishes"} <= set(preset):
        c, s = share("length_finishes", "finishes", "canary"), share("length_finishes", "finishes", "stable")
        query = f"({c} / clamp_min({s}, 1e-9)) * (({c} - {s}) >= bool {analysis.min_share_increase})"
        out.append(Check("finish-length-share-ratio", query, *_limit(analysis.max_length_share_ratio)))
    if {"completion_tokens", "completions"} <= set(preset):
        c, s = share("completion_tokens", "completions", "canary"), share("completion_tokens", "completions", "stable")
        lo, hi = analysis.min_tokens_ratio, analysis.max_tokens_ratio
        out.append(Check("completion-tokens-ratio", f"{c} / {s}",
                         f"len(result) > 0 && result[0] >= {lo} && result[0] <= {hi}",
                         f"len(result) > 0 && (result[0] < {lo} || result[0] > {hi})"))
    if {"empty", "completions"} <= set(preset):
        c, s = share("empty", "completions", "canary"), share("empty", "completions", "stable")
        query = f"({c} / clamp_min({s}, 1e-9)) * (({c} - {s}) >= bool {analysis.min_share_increase})"
        out.append(Check("empty-share-ratio", query, *_limit(analysis.max_empty_share_ratio)))
    return out


def analysis_template(*, name: str, namespace: str, labels: dict[str, str], prometheus_url: str,
                      preset: str, analysis: AnalysisSpec, window_s: float) -> dict[str, Any]:
    # Measured once per window, as promote judges: a failure ends the analysis at once, the
    # first intervals_per_step passes in a row end it successfully, and max_inconclusive
    # windows without a verdict are tolerated; one more makes the analysis inconclusive.
    metrics = [{
        "name": c.name,
        "interval": window_label(window_s),
        "count": analysis.max_inconclusive + analysis.intervals_per_step,
        "successCondition": c.success,
        "failureCondition": c.failure,
        "consecutiveSuccessLimit": analysis.intervals_per_step,
        "failureLimit": 0,
        "inconclusiveLimit": analysis.max_inconclusive,
        "provider": {"prometheus": {"address": prometheus_url, "query": c.query}},
    } for c in checks(preset, analysis, window_s)]
    return {
        "apiVersion": ROLLOUT_API,
        "kind": "AnalysisTemplate",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"args": [{"name": a} for a in ARGS], "metrics": metrics},
    }


def rollout(*, name: str, namespace: str, labels: dict[str, str], replicas: int, template: dict[str, Any],
            steps: list[int], window_s: float, template_name: str, args: dict[str, str],
            stable_service: str, canary_service: str, route: str) -> dict[str, Any]:
    """A canary Rollout: setWeight, pause one analysis window, analyse; reaching 100 promotes."""
    run_args = [{"name": k, "value": args[k]} for k in ARGS]
    plan: list[dict[str, Any]] = []
    for weight in steps:
        plan.append({"setWeight": weight})
        if weight < 100:
            plan.append({"pause": {"duration": window_label(window_s)}})
            plan.append({"analysis": {"templates": [{"templateName": template_name}], "args": run_args}})
    return {
        "apiVersion": ROLLOUT_API,
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": {"app.kubernetes.io/name": labels["app.kubernetes.io/name"]}},
            "template": template,
            "strategy": {"canary": {
                "stableService": stable_service,
                "canaryService": canary_service,
                "trafficRouting": {"plugins": {GATEWAY_PLUGIN: {"httpRoute": route, "namespace": namespace}}},
                "steps": plan,
            }},
        },
    }
