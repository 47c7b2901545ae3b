"""Gateway API data plane: the rendered HTTPRoute validates against the vendored CRD schema
(kubernetes-sigs/gateway-api v1.6.1), carries the weights, and round-trips through a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qlift.errors import BadInputError
from qlift.rollout.gateway import GatewayDataPlane, httproute_schema, render_httproute, validate_httproute
from qlift.rollout.spec import GatewaySpec, RolloutSpec


def gateway(**kw: object) -> GatewaySpec:
    base: dict[str, object] = {
        "route_name": "llm", "namespace": "serving", "parent_refs": [{"name": "inference-gw", "sectionName": "http"}],
        "hostnames": ["llm.example.internal"],
        "backends": {"smollm2": {"name": "llm-stable", "port": 8000}, "smollm2-ft": {"name": "llm-canary"}},
    }
    return GatewaySpec.model_validate({**base, **kw})


def test_vendored_schema_is_the_httproute_crd() -> None:
    schema = httproute_schema()
    backend_ref = schema["properties"]["spec"]["properties"]["rules"]["items"]["properties"]["backendRefs"]
    assert backend_ref["items"]["properties"]["weight"]["maximum"] == 1000000


@pytest.mark.parametrize("weights", [{"smollm2": 90, "smollm2-ft": 10}, {"smollm2": 0, "smollm2-ft": 100}])
def test_rendered_route_is_valid_and_carries_the_weights(weights: dict[str, int]) -> None:
    route = render_httproute(gateway(), weights)
    validate_httproute(route)
    refs = route["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["port"], r["weight"]) for r in refs] == [
        ("llm-stable", 8000, weights["smollm2"]), ("llm-canary", 8000, weights["smollm2-ft"])]
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1" and route["kind"] == "HTTPRoute"
    assert json.loads(route["metadata"]["annotations"]["qlift.dev/weights"]) == weights


@pytest.mark.parametrize(("path", "value", "where"), [
    (("spec", "rules", 0, "backendRefs", 0, "weight"), -1, "weight"),
    (("spec", "rules", 0, "matches", 0, "path", "type"), "Prefix", "type"),
    (("spec", "parentRefs", 0, "name"), "", "name"),
    (("spec", "hostnames", 0), "-bad-.host", "hostnames"),
])
def test_schema_catches_bad_renderings(path: tuple[object, ...], value: object, where: str) -> None:
    route = render_httproute(gateway(), {"smollm2": 50, "smollm2-ft": 50})
    node: object = route
    for key in path[:-1]:
        node = node[key]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]
    with pytest.raises(BadInputError, match=where):
        validate_httproute(route)


def test_file_data_plane_round_trips(tmp_path: Path) -> None:
    plane = GatewayDataPlane(gateway(output=tmp_path / "route.yaml"))
    assert plane.weights() is None
    plane.set_weights({"smollm2": 50, "smollm2-ft": 50})
    assert plane.weights() == {"smollm2": 50, "smollm2-ft": 50}
    validate_httproute(yaml.safe_load((tmp_path / "route.yaml").read_text()))


def test_gateway_spec_needs_a_target_and_both_versions() -> None:
    with pytest.raises(BadInputError, match="kubeconfig or gateway.output"):
        GatewayDataPlane(gateway())
    with pytest.raises(ValueError, match="gateway.backends lacks"):
        RolloutSpec.model_validate({"stable": "smollm2", "canary": "other", "data_plane": "gateway-api",
                                    "provider": "prometheus", "prometheus": {"url": "http://127.0.0.1:9090"},
                                    "gateway": gateway().model_dump()})


def test_kubeconfig_without_the_client_says_what_to_install(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("kubernetes") is not None:
        pytest.skip("the optional kubernetes client is installed")
    from qlift.errors import ExternalToolError

    plane = GatewayDataPlane(gateway(kubeconfig=tmp_path / "kubeconfig"))
    with pytest.raises(ExternalToolError, match="kubernetes client is not installed") as e:
        plane.set_weights({"smollm2": 90, "smollm2-ft": 10})
    assert "qlift[gateway]" in e.value.one_line()
    assert (tmp_path / "kubeconfig").exists() is False  # nothing was half-applied


def test_kubeconfig_data_plane_applies_through_the_client(tmp_path: Path) -> None:
    pytest.importorskip("kubernetes", reason="the kubernetes client is the optional 'gateway' extra")
    from kube_fake import FakeKube

    from qlift.rollout.gateway import GROUP, PLURAL, VERSION

    with FakeKube({(GROUP, VERSION, PLURAL): httproute_schema()}) as kube:
        plane = GatewayDataPlane(gateway(kubeconfig=kube.kubeconfig(tmp_path)))
        assert plane.weights() is None
        plane.set_weights({"smollm2": 90, "smollm2-ft": 10})
        plane.set_weights({"smollm2": 0, "smollm2-ft": 100})
        assert [r[0] for r in kube.requests] == ["GET", "PATCH", "POST", "PATCH"]
        assert plane.weights() == {"smollm2": 0, "smollm2-ft": 100}
        route = kube.get(GROUP, PLURAL, "serving", "llm")
        assert route is not None and route["metadata"]["generation"] == 2
