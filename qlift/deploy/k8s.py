"""Kubernetes objects for one served model version: Deployment (or a Rollout's pod template),
Service, HorizontalPodAutoscaler, and the prometheus-adapter rule the HPA's metric comes from.

The model is mounted read-only from a PersistentVolumeClaim that holds model directories
(``/models/<dir name>``): a pod that restarts or scales out reads the same bytes at once,
with no download step that could fetch something else or fail on a registry outage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from qlift.deploy.options import DeployOptions
from qlift.k8s_objects import labels
from qlift.serve.launch import config_yaml
from qlift.serve.recipes import Recipe

PORT = 8000
MODELS_MOUNT = "/models"
QUEUE_METRIC = "vllm:num_requests_waiting"  # vLLM's series: requests queued, not yet scheduled
# The custom metrics API allows no ':' in a metric name; prometheus-adapter renames it to this.
ADAPTER_METRIC = "vllm_num_requests_waiting"
GiB = 1024**3
DRAIN_S = 30  # vLLM's --shutdown-timeout unless the recipe sets one: `qlift serve --drain`'s default
# After the drain vLLM still stops its engine; Kubernetes SIGKILLs the pod when the grace period ends.
SHUTDOWN_MARGIN_S = 30


@dataclass
class Version:
    """One served model version as the cluster runs it."""

    role: str  # "stable" or "canary": the suffix of its object names
    model_dir_name: str  # the directory under the models PVC
    served_name: str  # vLLM's first served name: the model_name label of its metrics
    public_model: str  # the name clients send; every version answers to it too
    engine_args: dict[str, Any]
    env: dict[str, str]
    weight_bytes: int


def vllm_args(version: Version) -> list[str]:
    """``vllm serve`` arguments: the same keys and values
    ``qlift serve`` writes into its vLLM config file, as flags (``false`` -> ``--no-KEY``)."""
    model = Path(MODELS_MOUNT) / version.model_dir_name
    config = yaml.safe_load(config_yaml(model, "0.0.0.0", PORT, version.served_name, version.engine_args))
    names = [version.served_name] + ([version.public_model] if version.public_model != version.served_name else [])
    config["served-model-name"] = names
    args: list[str] = []
    for key, value in config.items():
        if isinstance(value, bool):
            args.append(f"--{key}" if value else f"--no-{key}")
        elif isinstance(value, list):
            args += [f"--{key}", *(str(v) for v in value)]
        elif isinstance(value, dict):
            args += [f"--{key}", json.dumps(value, separators=(",", ":"))]
        else:
            args += [f"--{key}", str(value)]
    return args


def resources(recipe: Recipe, version: Version) -> dict[str, dict[str, str]]:
    """GPUs from the recipe; host memory for loading the weights (and, on the CPU, the KV cache)."""
    if recipe.hardware.device == "gpu":
        memory = version.weight_bytes + 16 * GiB  # weights pass through host memory while loading
        gib = -(-memory // GiB)
        requests = {"cpu": "4", "memory": f"{gib}Gi", "nvidia.com/gpu": str(recipe.hardware.gpu_count)}
        return {"requests": requests, "limits": {"memory": f"{gib}Gi", "nvidia.com/gpu": requests["nvidia.com/gpu"]}}
    kv = int(recipe.engine.kv_cache_memory_bytes or 4 * GiB)
    gib = -(-(version.weight_bytes + kv + 4 * GiB) // GiB)
    return {"requests": {"cpu": "2", "memory": f"{gib}Gi"}, "limits": {"memory": f"{gib}Gi"}}


def container(recipe: Recipe, version: Version, image: str) -> dict[str, Any]:
    def probe() -> dict[str, Any]:
        return {"httpGet": {"path": "/health", "port": "http"}}

    return {
        "name": "vllm",
        "image": image,
        "command": ["vllm", "serve"],  # only `vllm serve` honours every server argument (api_server_count)
        "args": vllm_args(version),
        "env": [{"name": k, "value": v} for k, v in sorted(version.env.items())],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "resources": resources(recipe, version),
        # Loading weights (and compiling graphs) takes minutes: liveness waits for startup.
        "startupProbe": {**probe(), "periodSeconds": 10, "failureThreshold": 90},
        "readinessProbe": {**probe(), "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe(), "periodSeconds": 15, "failureThreshold": 4, "timeoutSeconds": 5},
        "volumeMounts": [
            {"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }


def grace_seconds(version: Version) -> int:
    """terminationGracePeriodSeconds: vLLM's drain (--shutdown-timeout) and the time it takes to stop after it."""
    return int(version.engine_args.get("shutdown_timeout") or 0) + SHUTDOWN_MARGIN_S


def pod_template(recipe: Recipe, version: Version, *, app: str, image: str, pvc: str) -> dict[str, Any]:
    return {
        "metadata": {
            "labels": labels(app, version.role),
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT),
                            "prometheus.io/path": "/metrics"},
        },
        "spec": {
            "containers": [container(recipe, version, image)],
            "terminationGracePeriodSeconds": grace_seconds(version),  # lets in-flight generations finish
            "volumes": [
                {"name": "models", "persistentVolumeClaim": {"claimName": pvc, "readOnly": True}},
                # vLLM's tensor-parallel workers share tensors through /dev/shm (64 MiB by default)
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
            ],
        },
    }


def deployment(recipe: Recipe, version: Version, opts: DeployOptions) -> dict[str, Any]:
    app, namespace = opts.app, opts.namespace
    name = f"{app}-{version.role}"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(app, version.role)},
        "spec": {
            "replicas": opts.replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": app, "qlift.dev/version": version.role}},
            # a new pod must be ready before an old one goes: capacity never dips during a change
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": pod_template(recipe, version, app=app, image=opts.image_for(recipe.hardware.device),
                                     pvc=opts.pvc),
        },
    }


def service(*, app: str, role: str, namespace: str, select_role: bool = True) -> dict[str, Any]:
    selector = {"app.kubernetes.io/name": app}
    if select_role:
        selector["qlift.dev/version"] = role
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{app}-{role}", "namespace": namespace, "labels": labels(app, role)},
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def hpa(opts: DeployOptions, target: dict[str, str], *, role: str) -> dict[str, Any]:
    """Scale ``target`` (and name the HPA after it) on requests waiting per pod: what a user feels as
    latency. CPU% says nothing here (a GPU server's CPU idles while its GPU is saturated; a CPU server
    is always near 100%)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": target["name"], "namespace": opts.namespace, "labels": labels(opts.app, role)},
        "spec": {
            "scaleTargetRef": target,
            "minReplicas": opts.replicas,
            "maxReplicas": opts.max_replicas,
            "metrics": [{
                "type": "Pods",
                "pods": {
                    "metric": {"name": ADAPTER_METRIC},
                    "target": {"type": "AverageValue", "averageValue": str(opts.queue_target)},
                },
            }],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
                # a new vLLM pod takes minutes to load: don't drop one on a short lull
                "scaleDown": {"stabilizationWindowSeconds": 600,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
            },
        },
    }


def adapter_rule() -> dict[str, Any]:
    """A prometheus-adapter rule that serves vLLM's queue depth per pod as a custom metric."""
    return {
        "seriesQuery": f'{QUEUE_METRIC}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{QUEUE_METRIC}$", "as": ADAPTER_METRIC},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }


def adapter_configmap(*, app: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{app}-prometheus-adapter-rules", "namespace": namespace, "labels": labels(app)},
        "data": {"config.yaml": yaml.safe_dump({"rules": [adapter_rule()]}, sort_keys=False)},
    }
