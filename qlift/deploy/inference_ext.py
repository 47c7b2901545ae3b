"""Gateway API Inference Extension objects for adapters served unmerged on one base Deployment.

A plain HTTPRoute splits traffic by Service: versions that are model names on one Deployment
(the base and its LoRA adapters) look like one backend to it. The Inference Extension routes
by the request body's model instead: the HTTPRoute's backend is an ``InferencePool`` (the base
Deployment's pods, ``inference.networking.k8s.io/v1``), and an ``InferenceModelRewrite``
(``inference.networking.x-k8s.io/v1alpha2``) maps the model clients send to the served models
with weights, which is what a rollout shifts. One ``InferenceObjective`` per adapter gives its
requests a priority in the pool's endpoint picker.

API versions are the ones the vendored CRDs define (tests/schemas/inference-extension/): the
InferencePool from kubernetes-sigs/gateway-api-inference-extension's main branch, the rewrite
and objective CRDs from its last commit that carried them (they moved to llm-d's inference
scheduler, which installs them with its endpoint picker). The endpoint picker itself (an EPP
Deployment and Service) comes with that install; qlift names its Service.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qlift.deploy import k8s
from qlift.deploy.options import DeployOptions
from qlift.k8s_objects import POOL_API, X_API, model_rewrite

EPP_PORT = 9002  # the endpoint picker's ext-proc gRPC port in the upstream manifests


def adapter_mount(path: Path) -> str:
    """Where an adapter dir sits in the pod: beside the models on the same PVC."""
    return f"{k8s.MODELS_MOUNT}/{Path(path).resolve().name}"


def lora_engine_args(engine: dict[str, Any], loras: dict[str, Path]) -> dict[str, Any]:
    """``engine`` with the adapters' paths rewritten to where the pod mounts them."""
    out = dict(engine)
    if loras:
        out["lora_modules"] = [f"{name}={adapter_mount(path)}" for name, path in loras.items()]
    return out


def inference_pool(*, app: str, namespace: str, role: str, epp: str) -> dict[str, Any]:
    return {
        "apiVersion": POOL_API,
        "kind": "InferencePool",
        "metadata": {"name": f"{app}-pool", "namespace": namespace, "labels": k8s.labels(app, role)},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": app, "qlift.dev/version": role}},
            "targetPorts": [{"number": k8s.PORT}],
            "endpointPickerRef": {"name": epp, "port": {"number": EPP_PORT}, "failureMode": "FailClose"},
        },
    }


def objective(*, app: str, namespace: str, model: str, priority: int = 0) -> dict[str, Any]:
    safe = "".join(c if c.isalnum() else "-" for c in model.lower()).strip("-")[:40]
    return {
        "apiVersion": X_API,
        "kind": "InferenceObjective",
        "metadata": {"name": f"{app}-{safe}", "namespace": namespace, "labels": k8s.labels(app),
                     "annotations": {"qlift.dev/model": model}},
        "spec": {"priority": priority,
                 "poolRef": {"group": POOL_API.split("/")[0], "kind": "InferencePool", "name": f"{app}-pool"}},
    }


def pool_route(*, app: str, namespace: str, gateway: str, gateway_namespace: str | None,
               path_prefix: str = "/v1") -> dict[str, Any]:
    """The HTTPRoute whose one backend is the InferencePool (the picker chooses the pod and model)."""
    parent: dict[str, Any] = {"name": gateway}
    if gateway_namespace:
        parent["namespace"] = gateway_namespace
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": app, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "qlift"}},
        "spec": {
            "parentRefs": [parent],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": path_prefix}}],
                "backendRefs": [{"group": POOL_API.split("/")[0], "kind": "InferencePool", "name": f"{app}-pool"}],
            }],
        },
    }


def objects(opts: DeployOptions, version: k8s.Version, *, weights: dict[str, int] | None = None,
            epp: str | None = None) -> dict[str, dict[str, Any]]:
    """File name -> object, for ``version``'s Deployment and ``opts.loras`` served on it: the pool, the
    rewrite of ``opts.served_as`` (all traffic to the version's model unless ``weights``), one objective
    per adapter, and the route onto the pool; valid against the CRD schemas the tests vendor."""
    app, namespace = opts.app, opts.namespace
    out = {
        "inferencepool.yaml": inference_pool(app=app, namespace=namespace, role=version.role,
                                             epp=epp or f"{app}-epp"),
        "inferencemodelrewrite.yaml": model_rewrite(app=app, namespace=namespace, public_model=opts.served_as,
                                                    weights=weights or {version.served_name: 100}),
    }
    for name in opts.loras:
        obj = objective(app=app, namespace=namespace, model=name)
        out[f"inferenceobjective-{obj['metadata']['name'].removeprefix(app + '-')}.yaml"] = obj
    out["httproute.yaml"] = pool_route(app=app, namespace=namespace, gateway=opts.gateway,
                                       gateway_namespace=opts.gateway_namespace)
    return out


def add_loras(version: k8s.Version, base_dir: Path, loras: dict[str, Path], *, cpu: bool = False) -> list[str]:
    """Check ``loras`` against the base (as `qlift serve --lora` does) and put them into ``version``'s
    engine arguments with the pod's paths; returns notes."""
    from qlift.models.modeldir import ModelDir
    from qlift.serve.lora import LoraServingOptions, plan_lora_serving

    if not loras:
        return []
    planned = plan_lora_serving(ModelDir.open(base_dir), loras, version.engine_args,
                                LoraServingOptions(served_name=version.served_name, cpu=cpu))
    version.engine_args = lora_engine_args({**version.engine_args, **planned.engine}, loras)
    return planned.notes
