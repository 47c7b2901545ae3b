"""qlift deploy k8s --data-plane builtin: a fleet of qlift routers in front of a vllm-router per version.

Every rendered object validated against Kubernetes 1.37's strict schemas (tests/schemas/k8s/), the fleet's
properties asserted (replicas, PodDisruptionBudget, anti-affinity, probes, Secrets by reference only, the
headless Service, RBAC, vllm-router's discovery arguments), the router's rendered command line and config run as
a real `qlift router` over small backends on 127.0.0.1, and vllm-router's arguments parsed by its own launcher."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from faults import RouterProcess, TinyBackend, until
from test_deploy import _model, validate

from qlift.deploy import DeployOptions, render_k8s
from qlift.rollout.spec import RolloutSpec

SECRET_VALUE = "s3cr3t-admin-token-never-rendered"


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, Path]:
    return _model(tmp_path, "chat-v1"), _model(tmp_path, "chat-v2")


def _render(models: tuple[Path, Path], **more: Any) -> dict[str, dict[str, Any]]:
    opts = DeployOptions(model=models[0], canary=models[1], recipe="chat-h100", data_plane="builtin",
                         namespace="serving", **more)
    return render_k8s(opts).objects


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _selects(selector: dict[str, str], pod_labels: dict[str, str]) -> bool:
    return all(pod_labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("recipe", ["chat-h100", "cpu"])
def test_every_object_matches_its_schema(models, recipe: str) -> None:
    result = render_k8s(DeployOptions(model=models[0], canary=models[1], recipe=recipe, data_plane="builtin"))
    kinds = sorted(o["kind"] for o in result.objects.values())
    assert kinds == sorted(["Deployment"] * 5 + ["Service"] * 6 + ["HorizontalPodAutoscaler"] * 2
                           + ["PodDisruptionBudget"] * 3 + ["ConfigMap"] * 2
                           + ["ServiceAccount", "Role", "RoleBinding"] * 2)  # no HTTPRoute: the routers split
    for obj in result.objects.values():
        validate(obj)


def test_router_fleet_is_highly_available(models) -> None:
    objs = _render(models, router_replicas=3)
    dep = objs["deployment-router.yaml"]
    selector = dep["spec"]["selector"]["matchLabels"]
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pdb = objs["pdb-router.yaml"]["spec"]
    assert pdb == {"minAvailable": 1, "selector": {"matchLabels": selector}}
    term = _pod(dep)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"] == {"labelSelector": {"matchLabels": selector},
                                       "topologyKey": "kubernetes.io/hostname"}
    c = _pod(dep)["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["livenessProbe"] == {"tcpSocket": {"port": "http"}, "periodSeconds": 15, "failureThreshold": 4}
    assert _pod(dep)["terminationGracePeriodSeconds"] > c["lifecycle"]["preStop"]["sleep"]["seconds"] + 30


def test_fewer_than_two_routers_is_refused(run_cli, models, tmp_path: Path) -> None:
    r = run_cli("deploy", "k8s", models[0], "--recipe", "chat-h100", "--data-plane", "builtin",
                "--router-replicas", "1", "-o", tmp_path / "o")
    assert r.exit_code == 2 and "--router-replicas" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("args", "needle"), [
    (["--router-secret", "Bad_Secret"], "--router-secret"),
    (["--router-image", "qlift latest"], "--router-image"),
    (["--vllm-router-image", "Vllm/router"], "--vllm-router-image"),
    (["--vllm-router-policy", "fastest"], "--vllm-router-policy"),
])
def test_bad_fleet_input_is_one_line(run_cli, models, tmp_path: Path, args: list[str], needle: str) -> None:
    r = run_cli("deploy", "k8s", models[0], "--recipe", "cpu", "--data-plane", "builtin", *args, "-o", tmp_path / "o")
    assert r.exit_code == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [["--rollout", "argo"], ["--gateway-api"]])
def test_builtin_plane_refuses_another_traffic_split(run_cli, models, tmp_path: Path, args: list[str]) -> None:
    r = run_cli("deploy", "k8s", models[0], "--recipe", "cpu", "--data-plane", "builtin", *args, "-o", tmp_path / "o")
    assert r.exit_code == 2 and "--data-plane" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_services_select_only_their_own_pods(models) -> None:
    objs = _render(models)
    client, headless = objs["service-router.yaml"], objs["service-router-fleet.yaml"]
    assert client["spec"]["type"] == "ClusterIP" and "clusterIP" not in client["spec"]
    assert headless["metadata"]["name"] == "llm-router-fleet"
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    pods = {f: o["spec"]["template"]["metadata"]["labels"] for f, o in objs.items() if o["kind"] == "Deployment"}
    for service in (o for o in objs.values() if o["kind"] == "Service"):
        chosen = sorted(f for f, lab in pods.items() if _selects(service["spec"]["selector"], lab))
        assert len(chosen) == 1, (service["metadata"]["name"], chosen)  # a selector never spans two kinds of pod
    for dep in (o for o in objs.values() if o["kind"] == "Deployment"):
        chosen = [f for f, lab in pods.items() if _selects(dep["spec"]["selector"]["matchLabels"], lab)]
        assert len(chosen) == 1, (dep["metadata"]["name"], chosen)


def test_secrets_are_referenced_never_rendered(run_cli, models, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", SECRET_VALUE)  # a token in the renderer's environment stays there
    out = tmp_path / "k8s"
    r = run_cli("deploy", "k8s", models[0], "--recipe", "chat-h100", "--canary", models[1], "--data-plane", "builtin",
                "--router-secret", "chat-router-keys", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    assert all(SECRET_VALUE not in f.read_text() for f in out.iterdir())
    assert SECRET_VALUE not in r.output
    objs = [yaml.safe_load(f.read_text()) for f in out.glob("*.yaml")]
    assert "Secret" not in {o.get("kind") for o in objs}
    dep = next(o for o in objs if o.get("kind") == "Deployment" and o["metadata"]["name"] == "llm-router")
    c = _pod(dep)["containers"][0]
    assert c["env"] == [{"name": "QLIFT_ROUTER_TOKEN",
                         "valueFrom": {"secretKeyRef": {"name": "chat-router-keys", "key": "admin-token"}}}]
    keys = next(v for v in _pod(dep)["volumes"] if v["name"] == "secrets")["secret"]
    assert keys == {"secretName": "chat-router-keys", "defaultMode": 0o400,
                    "items": [{"key": "api-keys", "path": "api-keys"}]}
    for o in objs:  # no container anywhere takes a credential as a literal value
        for ct in _pod(o)["containers"] if o.get("kind") == "Deployment" else []:
            for env in ct.get("env", []):
                assert "value" not in env or not any(w in env["name"] for w in ("TOKEN", "KEY", "SECRET"))
    configmap = next(o for o in objs if o["metadata"]["name"] == "llm-router-config")
    config = yaml.safe_load(configmap["data"]["router.yaml"])
    assert config["api_keys_file"] == "/etc/qlift/secrets/api-keys"
    for f in yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]:
        validate(yaml.safe_load((out / f).read_text()))


def test_router_backends_are_each_versions_vllm_router(models) -> None:
    objs = _render(models)
    args = _pod(objs["deployment-router.yaml"])["containers"][0]["args"]
    assert isinstance(args, list) and all(isinstance(a, str) for a in args)
    backends = [args[i + 1] for i, a in enumerate(args) if a == "--backend"]
    assert backends == ["stable=http://llm-stable-vllm-router.serving.svc:8000#chat-v1",
                        "canary=http://llm-canary-vllm-router.serving.svc:8000#chat-v2"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--weight"] == ["stable=100", "canary=0"]
    for role in ("stable", "canary"):
        svc = objs[f"service-vllm-router-{role}.yaml"]
        assert svc["metadata"]["name"] == f"llm-{role}-vllm-router" and svc["spec"]["ports"][0]["port"] == 8000
        pool = objs[f"deployment-vllm-router-{role}.yaml"]
        assert _selects(svc["spec"]["selector"], pool["spec"]["template"]["metadata"]["labels"])


def test_vllm_router_discovers_its_versions_pods(models) -> None:
    objs = _render(models)
    for role in ("stable", "canary"):
        pool = objs[f"deployment-vllm-router-{role}.yaml"]
        c = _pod(pool)["containers"][0]
        args = c["args"]
        assert c["command"] == ["vllm-router"] and "--service-discovery" in args
        i = args.index("--selector")
        selector = dict(a.split("=", 1) for a in args[i + 1:i + 3])
        vllm_pods = objs[f"deployment-{role}.yaml"]["spec"]["template"]["metadata"]["labels"]
        assert _selects(selector, vllm_pods)  # the version's vLLM pods, and no others
        assert not _selects(selector, pool["spec"]["template"]["metadata"]["labels"])
        other = "canary" if role == "stable" else "stable"
        assert not _selects(selector, objs[f"deployment-{other}.yaml"]["spec"]["template"]["metadata"]["labels"])
        assert args[args.index("--service-discovery-namespace") + 1] == "serving"
        assert args[args.index("--service-discovery-port") + 1] == "8000"
        assert _pod(pool)["serviceAccountName"] == "llm-vllm-router"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readiness"
        assert c["livenessProbe"]["httpGet"]["path"] == "/liveness"
        hpa = objs[f"hpa-{role}.yaml"]["spec"]["scaleTargetRef"]  # the replicas still scale on queue depth
        assert hpa == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"llm-{role}"}


def test_vllm_router_args_parse_in_vllm_router_itself(models) -> None:
    launcher = pytest.importorskip("vllm_router.launch_router")
    args = _pod(_render(models, vllm_router_policy="power_of_two")["deployment-vllm-router-canary.yaml"])
    parsed = launcher.parse_router_args(args["containers"][0]["args"])
    assert parsed.service_discovery is True
    assert parsed.selector == {"app.kubernetes.io/name": "llm", "qlift.dev/version": "canary"}
    assert (parsed.service_discovery_namespace, parsed.service_discovery_port) == ("serving", 8000)
    assert (parsed.policy, parsed.host, parsed.port) == ("power_of_two", "0.0.0.0", 8000)


def test_rbac_lets_vllm_router_read_pods_in_its_namespace_only(models) -> None:
    objs = _render(models)
    sa, role, binding = (objs[f"{k}-vllm-router.yaml"] for k in ("serviceaccount", "role", "rolebinding"))
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "serving"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "llm-vllm-router"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "serving"}]
    assert _pod(objs["deployment-router.yaml"])["automountServiceAccountToken"] is False


def _api_access(method: str, path: str) -> tuple[str, str, str]:
    """(API group, resource, RBAC verb) of one request to the Kubernetes API, as the API server authorizes it."""
    route, _, query = path.partition("?")
    parts = route.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1
    verbs = {"GET": "get" if named else "watch" if "watch=true" in query else "list", "POST": "create",
             "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    return group, resource, verbs[method]


def test_rbac_lets_promote_discover_the_routers_and_nothing_more(models, tmp_path: Path) -> None:
    """The promote Role grants exactly the calls discovery makes: each request discover_routers sends to the
    (fake) API server, as the API server would authorize it."""
    from kube_fake import FakeKube

    from qlift.rollout.fleet import discover_routers
    from qlift.rollout.spec_sections import RouterDiscovery

    objs = _render(models)
    sa, role, binding = (objs[f"{k}-promote.yaml"] for k in ("serviceaccount", "role", "rolebinding"))
    assert sa["metadata"]["name"] == "llm-promote" and role["metadata"]["namespace"] == "serving"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "llm-promote"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llm-promote", "namespace": "serving"}]
    slices = ("discovery.k8s.io", "v1", "endpointslices")
    with FakeKube({slices: {"type": "object"}}) as kube:
        kube.put(slices[0], slices[2], {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "llm-router-fleet-x", "namespace": "serving",
                         "labels": {"kubernetes.io/service-name": "llm-router-fleet"}},
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.0.0.1"]}]})
        spec = yaml.safe_load(yaml.safe_dump(render_k8s(DeployOptions(
            model=models[0], canary=models[1], recipe="chat-h100", data_plane="builtin", namespace="serving"))
            .promote_spec))
        where = RouterDiscovery(**spec["routers"]["discover"], kubeconfig=kube.kubeconfig(tmp_path))
        assert discover_routers(where) == ["http://10.0.0.1:8080"]
        used = {_api_access(method, path) for method, path, _ in kube.requests}
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert used == granted == {("discovery.k8s.io", "endpointslices", "list")}


def test_promote_spec_points_at_the_fleet(run_cli, models, tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    r = run_cli("deploy", "k8s", models[0], "--recipe", "cpu", "--canary", models[1], "--data-plane", "builtin",
                "--namespace", "serving", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    name = "promote-rollout.yaml"
    assert json.loads(r.stdout)["promote_spec"] == name
    spec = yaml.safe_load((out / name).read_text())
    assert spec["routers"] == {"discover": {"service": "llm-router-fleet", "namespace": "serving"}}
    assert (spec["stable"], spec["canary"], spec["data_plane"], spec["provider"]) == (
        "stable", "canary", "builtin", "builtin")
    RolloutSpec.model_validate(spec)
    assert (out / name).read_text().startswith(f"# qlift promote start -f {name}")
    assert "# in the cluster, as ServiceAccount llm-promote " in (out / name).read_text()
    assert json.loads((out / "qlift.json").read_text())["parameters"]["data_plane"] == "builtin"
    if shutil.which("kubectl"):  # kustomize builds the directory as `kubectl apply -k` would
        built = subprocess.run(["kubectl", "kustomize", str(out)], capture_output=True, text=True, timeout=60)
        assert built.returncode == 0, built.stderr


def test_written_yaml_passes_yamllint(run_cli, models, tmp_path: Path) -> None:
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    out = tmp_path / "k8s"
    r = run_cli("deploy", "k8s", models[0], "--recipe", "cpu", "--canary", models[1], "--data-plane", "builtin",
                "-o", out)
    assert r.exit_code == 0, r.output
    conf = YamlLintConfig("extends: default")
    files = sorted(out.glob("*.yaml"))
    problems = [f"{f.name}:{p.line}: {p.desc}" for f in files for p in linter.run(f.read_text(), conf)]
    assert problems == []


def _listening(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


def test_rendered_router_runs_and_its_probes_mean_what_they_say(models, tmp_path: Path) -> None:
    """The router's rendered command line and router.yaml, as the pod runs them, with the cluster's paths and
    Service URLs moved to tmp_path and 127.0.0.1: the API keys file (the Secret's) guards the data path, /health
    (readiness) turns 503 when no backend answers while the port (liveness) still listens."""
    objs = _render(models)
    c = _pod(objs["deployment-router.yaml"])["containers"][0]
    config = yaml.safe_load(objs["configmap-router.yaml"]["data"]["router.yaml"])
    (tmp_path / "api-keys").write_text("client-key-1\n")
    config |= {"api_keys_file": str(tmp_path / "api-keys"), "state_file": str(tmp_path / "state.json"),
               "health": {"interval_s": 0.2, "timeout_s": 1.0, "failures": 1}}
    (tmp_path / "router.yaml").write_text(yaml.safe_dump(config))
    with TinyBackend("chat-v1") as stable, TinyBackend("chat-v2") as canary:
        urls = {"llm-stable-vllm-router.serving.svc:8000": stable.url.removeprefix("http://"),
                "llm-canary-vllm-router.serving.svc:8000": canary.url.removeprefix("http://")}
        args = list(c["args"])
        for cluster, local in urls.items():
            args = [a.replace(cluster, local) for a in args]
        args[args.index("--config") + 1] = str(tmp_path / "router.yaml")
        args[args.index("--host") + 1] = "127.0.0.1"
        args[args.index("--port") + 1] = "0"
        with RouterProcess(*args, log_path=tmp_path / "router.log", token="admin-from-secret") as router:
            assert httpx.get(router.url + "/health", timeout=5).status_code == 200
            body = {"model": "llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            assert httpx.post(router.url + "/v1/chat/completions", json=body, timeout=10).status_code == 401
            ok = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=10,
                            headers={"Authorization": "Bearer client-key-1"})
            assert ok.status_code == 200 and stable.requests == 1 and canary.requests == 0
            assert router.admin().state().weights == {"stable": 100, "canary": 0}
            stable.healthy = canary.healthy = False
            until(lambda: httpx.get(router.url + "/health", timeout=5).status_code == 503, 20, "readiness fails")
            assert _listening(router.url)  # liveness (tcpSocket) holds: no restart loses the request log
