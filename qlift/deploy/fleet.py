"""The builtin data plane on Kubernetes (``qlift deploy k8s --data-plane builtin``): a fleet of qlift routers in
front of one vllm-router per version, each over that version's vLLM Deployment (its HPA as on the other plane).

The routers are a Deployment of at least two pods (a PodDisruptionBudget keeps one, anti-affinity spreads them
over nodes) behind a ClusterIP Service for clients and a headless Service whose EndpointSlices list every router
pod, which a rollout discovers its routers through. Their admin token and client API keys come from a Secret the
user creates: no secret value is ever rendered. Each vllm-router finds its version's pods through the Kubernetes
API (``--service-discovery``), with a ServiceAccount allowed to read pods in the namespace and nothing more;
`qlift promote` run in the cluster finds the routers with another (APP-promote), allowed to list EndpointSlices.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from qlift.deploy import k8s
from qlift.deploy.options import DeployOptions
from qlift.k8s_objects import labels, router_fleet_service
from qlift.rollout.fleet import DISCOVERY_RULES
from qlift.rollout.spec import RolloutSpec

ROUTER_PORT = 8080
POOL_PORT = k8s.PORT  # vllm-router listens where vLLM does: a version's URL keeps vLLM's port
POOL_METRICS_PORT = 29000  # vllm-router's Prometheus port
TOKEN_KEY, API_KEYS_KEY = "admin-token", "api-keys"  # the keys of the routers' Secret
CONFIG_DIR, SECRETS_DIR, STATE_DIR = "/etc/qlift/router", "/etc/qlift/secrets", "/var/lib/qlift"
DRAIN_S = 30  # the router's drain_s: in-flight answers get this long after SIGTERM
# Before SIGTERM the pod waits while the Service and kube-proxy drop it, so no new request lands on a closing router.
PRESTOP_S = 5


def router_name(app: str) -> str:
    return f"{app}-router"


def pool_name(app: str, role: str) -> str:
    """A version's vllm-router Deployment and Service."""
    return f"{app}-{role}-vllm-router"


def discovery_account(app: str) -> str:
    """The vllm-routers' ServiceAccount, Role and RoleBinding."""
    return f"{app}-vllm-router"


def promote_account(app: str) -> str:
    """The ServiceAccount (with its Role and RoleBinding) to run `qlift promote` under in the cluster."""
    return f"{app}-promote"


def router_labels(app: str) -> dict[str, str]:
    # No qlift.dev/version label: the versions' Services, Deployments and HPAs select on it.
    return {**labels(app), "app.kubernetes.io/component": "router"}


def pool_labels(app: str, role: str) -> dict[str, str]:
    return {**labels(app), "app.kubernetes.io/component": "vllm-router", "qlift.dev/pool": role}


def pool_url(opts: DeployOptions, role: str) -> str:
    return f"http://{pool_name(opts.app, role)}.{opts.namespace}.svc:{POOL_PORT}"


def router_config() -> dict[str, Any]:
    """router.yaml (a ConfigMap): what `qlift router` takes only from --config. The state file lives on the pod's
    own volume (beside a read-only ConfigMap the router could not write it), so a restarted container keeps the
    weights the admin API set."""
    return {"api_keys_file": f"{SECRETS_DIR}/{API_KEYS_KEY}", "state_file": f"{STATE_DIR}/router.state.json",
            "drain_s": DRAIN_S}


def router_args(opts: DeployOptions, versions: list[k8s.Version]) -> list[str]:
    """`qlift router` arguments: each version a backend at its vllm-router Service, named by its role and checked
    to serve its own model; all traffic on the stable until a rollout moves it."""
    args = ["--config", f"{CONFIG_DIR}/router.yaml", "--host", "0.0.0.0", "--port", str(ROUTER_PORT),
            "--public-model", opts.served_as]
    for v in versions:
        args += ["--backend", f"{v.role}={pool_url(opts, v.role)}#{v.served_name}"]
    for v in versions:
        args += ["--weight", f"{v.role}={100 if v.role == 'stable' else 0}"]
    return args


def check_router_args(args: list[str]) -> None:
    """Parse ``args`` as `qlift router` will (its config file aside): a bad backend fails here, not in the pod."""
    from qlift.router.config import build_config, parse_config

    parse_config(router_config(), path="router.yaml")
    taken = {flag: [args[i + 1] for i, a in enumerate(args) if a == flag] for flag in ("--backend", "--weight")}
    build_config(config_path=None, backends=taken["--backend"], weights=taken["--weight"],
                 flags={"public_model": args[args.index("--public-model") + 1], "host": "0.0.0.0",
                        "port": ROUTER_PORT})


def _spread(selector: dict[str, str]) -> dict[str, Any]:
    """Pods of one Deployment on different nodes where the cluster has them: preferred, not required, so a
    rolling update's extra pod and a one-node cluster still schedule (the PodDisruptionBudget keeps one serving)."""
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "podAffinityTerm": {"labelSelector": {"matchLabels": selector}, "topologyKey": "kubernetes.io/hostname"},
    }]}}


def _deployment(opts: DeployOptions, name: str, pod_labels: dict[str, str], replicas: int,
                pod_spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": pod_labels}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": opts.namespace, "labels": pod_labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": pod_labels},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": meta, "spec": {**pod_spec, "affinity": _spread(pod_labels)}},
        },
    }


def pdb(opts: DeployOptions, name: str, selector: dict[str, str]) -> dict[str, Any]:
    """One pod of ``selector`` stays up through voluntary disruptions (a node drain, a cluster upgrade)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": opts.namespace, "labels": selector},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": selector}},
    }


def _secret_env(opts: DeployOptions) -> dict[str, Any]:
    return {"name": "QLIFT_ROUTER_TOKEN", "valueFrom": {"secretKeyRef": {"name": opts.secret, "key": TOKEN_KEY}}}


def router_deployment(opts: DeployOptions, versions: list[k8s.Version]) -> dict[str, Any]:
    args = router_args(opts, versions)
    check_router_args(args)
    container = {
        "name": "router",
        "image": opts.router_image,
        "command": ["qlift", "router"],
        "args": args,
        "env": [_secret_env(opts)],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        # /health is 503 while no backend is healthy: the pod leaves the Service, but a restart would not bring a
        # backend back and would lose the request log a rollout judges, so liveness asks only that it listens.
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 15, "failureThreshold": 4},
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_S}}},
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "secrets", "mountPath": SECRETS_DIR, "readOnly": True},
            {"name": "state", "mountPath": STATE_DIR},
        ],
    }
    spec = {
        "automountServiceAccountToken": False,  # the routers never call the Kubernetes API
        "containers": [container],
        "terminationGracePeriodSeconds": PRESTOP_S + DRAIN_S + 10,
        "volumes": [
            {"name": "config", "configMap": {"name": f"{router_name(opts.app)}-config"}},
            {"name": "secrets", "secret": {"secretName": opts.secret, "defaultMode": 0o400,
                                           "items": [{"key": API_KEYS_KEY, "path": API_KEYS_KEY}]}},
            {"name": "state", "emptyDir": {}},
        ],
    }
    return _deployment(opts, router_name(opts.app), router_labels(opts.app), opts.router_replicas, spec)


def router_services(opts: DeployOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ClusterIP Service clients call, and the headless one listing every router pod, ready or not (a router
    whose backends are down still takes a rollout's weights)."""
    def service(name: str, extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": opts.namespace, "labels": router_labels(opts.app)},
            "spec": {**extra, "selector": router_labels(opts.app),
                     "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}]},
        }

    return (service(router_name(opts.app), {"type": "ClusterIP"}),
            service(router_fleet_service(opts.app), {"clusterIP": "None", "publishNotReadyAddresses": True}))


def pool_args(opts: DeployOptions, role: str) -> list[str]:
    """vllm-router over the version's vLLM pods, found through the Kubernetes API by the labels its Deployment
    selects on (in this namespace only, so a Role suffices)."""
    return ["--host", "0.0.0.0", "--port", str(POOL_PORT), "--policy", opts.vllm_router_policy,
            "--service-discovery", "--selector", f"app.kubernetes.io/name={opts.app}", f"qlift.dev/version={role}",
            "--service-discovery-namespace", opts.namespace, "--service-discovery-port", str(k8s.PORT),
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(POOL_METRICS_PORT)]


def pool_deployment(opts: DeployOptions, role: str) -> dict[str, Any]:
    container = {
        "name": "vllm-router",
        "image": opts.vllm_router_image,
        "command": ["vllm-router"],
        "args": pool_args(opts, role),
        "ports": [{"name": "http", "containerPort": POOL_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": POOL_METRICS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        # /readiness is 503 until a replica of the version is healthy; /liveness only says the process answers.
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "periodSeconds": 15, "failureThreshold": 4},
    }
    spec = {"serviceAccountName": discovery_account(opts.app), "containers": [container]}
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(POOL_METRICS_PORT),
              "prometheus.io/path": "/metrics"}
    return _deployment(opts, pool_name(opts.app, role), pool_labels(opts.app, role), opts.router_replicas, spec,
                       annotations=scrape)


def pool_service(opts: DeployOptions, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": pool_name(opts.app, role), "namespace": opts.namespace,
                     "labels": pool_labels(opts.app, role)},
        "spec": {"type": "ClusterIP", "selector": pool_labels(opts.app, role),
                 "ports": [{"name": "http", "port": POOL_PORT, "targetPort": "http", "protocol": "TCP"}]},
    }


def _rbac(opts: DeployOptions, name: str, suffix: str, rules: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A ServiceAccount ``name``, a Role granting ``rules`` in the namespace, and the RoleBinding between them."""
    ns = opts.namespace
    meta = {"name": name, "namespace": ns, "labels": labels(opts.app)}
    return {
        f"serviceaccount-{suffix}.yaml": {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        f"role-{suffix}.yaml": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
                                "rules": rules},
        f"rolebinding-{suffix}.yaml": {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        },
    }


def discovery_rbac(opts: DeployOptions) -> dict[str, dict[str, Any]]:
    """What vllm-router's service discovery needs: read and watch pods in this namespace."""
    return _rbac(opts, discovery_account(opts.app), "vllm-router",
                 [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}])


def promote_rbac(opts: DeployOptions) -> dict[str, dict[str, Any]]:
    """What `qlift promote` run in the cluster needs to find the routers (``routers.discover``): exactly the calls
    rollout/fleet.py's discovery makes (list the headless Service's EndpointSlices), in this namespace. Promote
    talks to the routers themselves over HTTP, with the admin token."""
    return _rbac(opts, promote_account(opts.app), "promote", copy.deepcopy(DISCOVERY_RULES))


def objects(opts: DeployOptions, versions: list[k8s.Version]) -> dict[str, dict[str, Any]]:
    """File name -> object for the fleet and each version's vllm-router (the versions' vLLM Deployments, Services
    and HPAs are rendered as on the other plane)."""
    app, ns = opts.app, opts.namespace
    client, headless = router_services(opts)
    out = discovery_rbac(opts) | promote_rbac(opts)
    for v in versions:
        out[f"deployment-vllm-router-{v.role}.yaml"] = pool_deployment(opts, v.role)
        out[f"service-vllm-router-{v.role}.yaml"] = pool_service(opts, v.role)
        out[f"pdb-vllm-router-{v.role}.yaml"] = pdb(opts, pool_name(app, v.role), pool_labels(app, v.role))
    out["configmap-router.yaml"] = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{router_name(app)}-config", "namespace": ns, "labels": router_labels(app)},
        "data": {"router.yaml": yaml.safe_dump(router_config(), sort_keys=False)},
    }
    out["deployment-router.yaml"] = router_deployment(opts, versions)
    out["pdb-router.yaml"] = pdb(opts, router_name(app), router_labels(app))
    out["service-router.yaml"] = client
    out["service-router-fleet.yaml"] = headless
    return out


def promote_spec(opts: DeployOptions, stable: k8s.Version, canary: k8s.Version) -> dict[str, Any]:
    """The `qlift promote start -f` spec: the builtin plane on every router the headless Service lists, judged on
    the routers' own request logs and answers; checked as RolloutSpec checks it."""
    data: dict[str, Any] = {
        "stable": stable.role,
        "canary": canary.role,
        "data_plane": "builtin",
        "provider": "builtin",
        "vllm_metrics": False,  # a version's URL is its vllm-router, which serves no vLLM /metrics
        "routers": {"discover": {"service": router_fleet_service(opts.app), "namespace": opts.namespace}},
    }
    RolloutSpec.model_validate(data)
    return data
