"""Argo Rollouts: a ``Rollout`` (canary 10 -> 50 -> 100 with pauses and analysis) and an
``AnalysisTemplate`` whose Prometheus queries are ``qlift promote``'s own.

Each check of promote's judge (the registry ``qlift.rollout.checks.CHECKS``, where each check
carries its own PromQL form) becomes one metric. Its query is built from the PromQL preset
``qlift promote --prometheus`` uses (``qlift.rollout.prometheus.PRESETS``) with ``$backend`` /
``$model`` bound to the AnalysisRun's arguments, and its limits and tolerances are the
fields of ``AnalysisSpec``. A query yields a value only when the canary is over its
tolerance, so a success condition ``<= limit`` is the judge's pass; an empty or NaN answer
(no traffic yet) satisfies neither condition, which Argo counts as inconclusive and measures
again one window later, as the judge holds. What Argo cannot do is the judge's significance
tests: an over-limit window fails at once.
"""

from __future__ import annotations

from typing import Any

from qlift.rollout.checks import PromqlMetric, argo_metrics
from qlift.rollout.prometheus import PRESETS, window_label
from qlift.rollout.spec import AnalysisSpec

ROLLOUT_API = "argoproj.io/v1alpha1"
GATEWAY_PLUGIN = "argoproj-labs/gatewayAPI"  # Argo Rollouts' Gateway API traffic-router plugin
ARGS = ("stable", "canary", "stable-model", "canary-model")


Check = PromqlMetric  # one metric of the template: a query and the conditions on its one value


def checks(preset_name: str, analysis: AnalysisSpec, window_s: float) -> list[PromqlMetric]:
    """promote's checks (``qlift.rollout.checks.CHECKS``), in the judge's order, for the fields the
    preset has queries for."""
    return argo_metrics(PRESETS[preset_name], analysis, window_label(window_s))


def template_args(metrics: list[PromqlMetric]) -> list[str]:
    """The AnalysisRun arguments the queries use (the nginx preset adds each version's scrape instance)."""
    extra = [f"{role}-instance" for role in ("stable", "canary")
             if any(f"{{{{args.{role}-instance}}}}" in m.query for m in metrics)]
    return [*ARGS, *extra]


def analysis_template(*, name: str, namespace: str, labels: dict[str, str], prometheus_url: str,
                      preset: str, analysis: AnalysisSpec, window_s: float) -> dict[str, Any]:
    # Measured once per window, as promote judges: a failure ends the analysis at once, the
    # first intervals_per_step passes in a row end it successfully, and max_inconclusive
    # windows without a verdict are tolerated; one more makes the analysis inconclusive.
    found = checks(preset, analysis, window_s)
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
    } for c in found]
    return {
        "apiVersion": ROLLOUT_API,
        "kind": "AnalysisTemplate",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"args": [{"name": a} for a in template_args(found)], "metrics": metrics},
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
