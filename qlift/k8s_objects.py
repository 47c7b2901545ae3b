"""Kubernetes object pieces that both ``qlift deploy`` (which renders them) and the rollout's data planes
(which apply them) build: the labels qlift puts on its objects, and the Gateway API Inference
Extension's ``InferenceModelRewrite``, whose weights the ``inference-ext`` plane shifts.

Below ``qlift.deploy`` and ``qlift.rollout`` both, so neither imports the other for them.
"""

from __future__ import annotations

from typing import Any

POOL_API = "inference.networking.k8s.io/v1"
X_API = "inference.networking.x-k8s.io/v1alpha2"


def labels(app: str, role: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": app, "app.kubernetes.io/managed-by": "qlift"}
    if role:
        out["qlift.dev/version"] = role
    return out


def router_fleet_service(app: str) -> str:
    """The headless Service whose EndpointSlices list every qlift router pod of ``app`` that ``qlift deploy k8s
    --data-plane builtin`` renders: the name a rollout discovers its routers by."""
    return f"{app}-router-fleet"


def model_rewrite(*, app: str, namespace: str, public_model: str, weights: dict[str, int]) -> dict[str, Any]:
    """Requests for ``public_model`` go to each served model in proportion to its weight; a weight of 0
    leaves the model out (the CRD's weights start at 1)."""
    targets = [{"modelRewrite": model, "weight": int(w)} for model, w in weights.items() if w > 0]
    if not targets:
        raise ValueError("at least one model needs a positive weight")
    return {
        "apiVersion": X_API,
        "kind": "InferenceModelRewrite",
        "metadata": {"name": f"{app}-rewrite", "namespace": namespace, "labels": labels(app)},
        "spec": {
            "poolRef": {"group": POOL_API.split("/")[0], "kind": "InferencePool", "name": f"{app}-pool"},
            "rules": [{"matches": [{"model": {"type": "Exact", "value": public_model}}], "targets": targets}],
        },
    }
