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

from qlift.deploy import k8s
from qlift.deploy.options import DeployOptions
from qlift.rollout.analysis import error_limit
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


def checks_name(app: str) -> str:
    """The AnalysisTemplate's name."""
    return f"{app}-canary-checks"


def analysis_template(opts: DeployOptions, analysis: AnalysisSpec, *, window_s: float,
                      preset: str = "vllm") -> dict[str, Any]:
    """promote's checks against ``opts.prometheus_url``, with the queries of the PromQL ``preset``."""
    # Measured once per window, as promote judges: a failure ends the analysis at once, the
    # first intervals_per_step passes in a row end it successfully, and max_inconclusive
    # windows without a verdict are tolerated; one more makes the analysis inconclusive; as many
    # measurements in a row that error (no data from Prometheus) as promote tolerates.
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
        "consecutiveErrorLimit": error_limit(analysis),  # promote's, not Argo's default of 4
        "provider": {"prometheus": {"address": opts.prometheus_url, "query": c.query}},
    } for c in found]
    return {
        "apiVersion": ROLLOUT_API,
        "kind": "AnalysisTemplate",
        "metadata": {"name": checks_name(opts.app), "namespace": opts.namespace, "labels": k8s.labels(opts.app)},
        "spec": {"args": [{"name": a} for a in template_args(found)], "metrics": metrics},
    }


def rollout(opts: DeployOptions, template: dict[str, Any], args: dict[str, str], *, steps: list[int],
            window_s: float) -> dict[str, Any]:
    """A canary Rollout named ``opts.app`` between its -stable and -canary Services, on the HTTPRoute of that
    name: setWeight, pause one analysis window, analyse (``args`` are the AnalysisRun's); reaching 100 promotes."""
    app, namespace = opts.app, opts.namespace
    run_args = [{"name": k, "value": args[k]} for k in ARGS]
    plan: list[dict[str, Any]] = []
    for weight in steps:
        plan.append({"setWeight": weight})
        if weight < 100:
            plan.append({"pause": {"duration": window_label(window_s)}})
            plan.append({"analysis": {"templates": [{"templateName": checks_name(app)}], "args": run_args}})
    return {
        "apiVersion": ROLLOUT_API,
        "kind": "Rollout",
        "metadata": {"name": app, "namespace": namespace, "labels": k8s.labels(app)},
        "spec": {
            "replicas": opts.replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": {"app.kubernetes.io/name": app}},
            "template": template,
            "strategy": {"canary": {
                "stableService": f"{app}-stable",
                "canaryService": f"{app}-canary",
                "trafficRouting": {"plugins": {GATEWAY_PLUGIN: {"httpRoute": app, "namespace": namespace}}},
                "steps": plan,
            }},
        },
    }
