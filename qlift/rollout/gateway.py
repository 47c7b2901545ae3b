"""Gateway API as the data plane: an ``HTTPRoute`` whose ``backendRefs`` carry the weights.

The route is validated against the HTTPRoute CRD's OpenAPI schema (vendored from
kubernetes-sigs/gateway-api, see schemas/) before it is written or applied. With a
kubeconfig it is applied through the official ``kubernetes`` client (``pip install
qlift[gateway]``), created on the first change and merge-patched after; with ``output``
the YAML is (also) written to a file for GitOps. CEL rules (``x-kubernetes-validations``)
are left to the API server.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import yaml

from qlift.errors import BadInputError, ExternalToolError
from qlift.rollout.spec import GatewaySpec

GROUP, VERSION, PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"
SCHEMA_FILE = Path(__file__).with_name("schemas") / "gateway.networking.k8s.io_httproutes.yaml"
_WEIGHTS_ANNOTATION = "qlift.dev/weights"


def render_httproute(spec: GatewaySpec, weights: dict[str, int]) -> dict[str, Any]:
    """The HTTPRoute for ``weights`` (version -> percent; Gateway API weights are relative)."""
    route: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HTTPRoute",
        "metadata": {
            "name": spec.route_name,
            "namespace": spec.namespace,
            "labels": {"app.kubernetes.io/managed-by": "qlift"},
            "annotations": {_WEIGHTS_ANNOTATION: json.dumps(weights, sort_keys=True)},
        },
        "spec": {
            "parentRefs": [p.model_dump(exclude_none=True) for p in spec.parent_refs],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": spec.path_prefix}}],
                "backendRefs": [
                    {"kind": "Service", "name": ref.name, "port": ref.port, "weight": int(weights.get(v, 0))}
                    for v, ref in spec.backends.items()
                ],
            }],
        },
    }
    if spec.hostnames:
        route["spec"]["hostnames"] = list(spec.hostnames)
    return route


@functools.cache
def httproute_schema() -> dict[str, Any]:
    crd = yaml.safe_load(SCHEMA_FILE.read_text(encoding="utf-8"))
    for v in crd["spec"]["versions"]:
        if v["name"] == VERSION:
            return v["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]
    raise KeyError(VERSION)


def validate_httproute(route: dict[str, Any]) -> None:
    """Raise BadInputError naming the first field the CRD schema rejects."""
    import jsonschema

    validator = jsonschema.Draft7Validator(httproute_schema())
    error = next(iter(sorted(validator.iter_errors(route), key=lambda e: list(e.path))), None)
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(root)"
        raise BadInputError(f"rendered HTTPRoute is invalid at {where}: {error.message}", field="gateway")


class GatewayDataPlane:
    kind = "gateway-api"

    def __init__(self, spec: GatewaySpec) -> None:
        self.spec = spec
        if spec.kubeconfig is None and spec.output is None:
            raise BadInputError("the gateway-api data plane needs gateway.kubeconfig or gateway.output",
                                field="gateway")

    def _api(self) -> Any:
        try:
            from kubernetes import client, config
        except ImportError:
            raise ExternalToolError("the kubernetes client is not installed",
                                    hint="pip install 'qlift[gateway]'", tool="kubernetes") from None
        assert self.spec.kubeconfig is not None
        api_client = config.new_client_from_config(config_file=str(self.spec.kubeconfig.expanduser()),
                                                   context=self.spec.context)
        return client.CustomObjectsApi(api_client)

    def weights(self) -> dict[str, int] | None:
        route: dict[str, Any] | None = None
        if self.spec.kubeconfig is not None:
            try:
                route = self._api().get_namespaced_custom_object(
                    GROUP, VERSION, self.spec.namespace, PLURAL, self.spec.route_name)
            except Exception:  # not created yet, or unreachable: the journal knows
                return None
        elif self.spec.output is not None and Path(self.spec.output).exists():
            route = yaml.safe_load(Path(self.spec.output).read_text(encoding="utf-8"))
        if not route:
            return None
        refs = route["spec"]["rules"][0]["backendRefs"]
        by_service = {ref.name: v for v, ref in self.spec.backends.items()}
        return {by_service.get(r["name"], r["name"]): int(r.get("weight", 1)) for r in refs}

    def set_weights(self, weights: dict[str, int]) -> None:
        route = render_httproute(self.spec, weights)
        validate_httproute(route)
        if self.spec.output is not None:
            out = Path(self.spec.output)
            tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
            tmp.write_text(yaml.safe_dump(route, sort_keys=False), encoding="utf-8")
            os.replace(tmp, out)
        if self.spec.kubeconfig is not None:
            self._apply(route)

    def _apply(self, route: dict[str, Any]) -> None:
        api = self._api()
        from kubernetes.client.exceptions import ApiException

        ns, name = self.spec.namespace, self.spec.route_name
        try:
            api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, route)
        except ApiException as exc:
            if exc.status != 404:
                raise ExternalToolError(f"applying HTTPRoute {ns}/{name} failed: {exc.reason}",
                                        tool="kubernetes") from None
            api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, route)

    def backend_urls(self) -> dict[str, str]:
        return {}
