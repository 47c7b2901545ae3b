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
from typing import Any, ClassVar

import yaml

from qlift.errors import BadInputError, ExternalToolError
from qlift.loaders import read_yaml
from qlift.rollout.planes import PLANES, Capability
from qlift.rollout.spec import GatewaySpec, RolloutSpec

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


def crd_schema(path: Path, version: str) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``version`` in the CRD file at ``path``."""
    crd = read_yaml(path)
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]
    raise KeyError(version)


@functools.cache
def httproute_schema() -> dict[str, Any]:
    return crd_schema(SCHEMA_FILE, VERSION)


def validate_object(obj: dict[str, Any], schema: dict[str, Any], *, field: str) -> None:
    """Raise BadInputError naming the first field of ``obj`` the CRD schema rejects."""
    import jsonschema

    validator = jsonschema.Draft7Validator(schema)
    error = next(iter(sorted(validator.iter_errors(obj), key=lambda e: list(e.path))), None)
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(root)"
        raise BadInputError(f"rendered {obj.get('kind', 'object')} is invalid at {where}: {error.message}",
                            field=field)


def validate_httproute(route: dict[str, Any]) -> None:
    validate_object(route, httproute_schema(), field="gateway")


def write_yaml(path: Path, obj: dict[str, Any]) -> None:
    """Write ``obj`` as YAML atomically (GitOps picks up whole files only)."""
    out = Path(path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(yaml.safe_dump(obj, sort_keys=False), encoding="utf-8")
    os.replace(tmp, out)


class CustomObject:
    """One namespaced custom object through the official ``kubernetes`` client: read, and apply (merge-patch,
    created on 404)."""

    def __init__(self, kubeconfig: Path, context: str | None, group: str, version: str, plural: str,
                 namespace: str, name: str) -> None:
        self.kubeconfig, self.context = kubeconfig, context
        self.group, self.version, self.plural, self.namespace, self.name = group, version, plural, namespace, name

    def _api(self) -> Any:
        try:
            from kubernetes import client, config
        except ImportError:
            raise ExternalToolError("the kubernetes client is not installed",
                                    hint="pip install 'qlift[gateway]'", tool="kubernetes") from None
        try:
            api_client = config.new_client_from_config(config_file=str(self.kubeconfig.expanduser()),
                                                       context=self.context)
        except (config.ConfigException, OSError) as exc:
            raise BadInputError(f"cannot use kubeconfig {self.kubeconfig}: {exc}", field="kubeconfig") from None
        return client.CustomObjectsApi(api_client)

    def get(self) -> dict[str, Any] | None:
        """The object, or None when it does not exist yet or cannot be read (the journal knows the weights)."""
        try:
            obj: dict[str, Any] = self._api().get_namespaced_custom_object(
                self.group, self.version, self.namespace, self.plural, self.name)
        except ExternalToolError:
            raise
        except Exception:
            return None
        return obj

    def apply(self, obj: dict[str, Any]) -> None:
        api = self._api()
        import urllib3
        from kubernetes.client.exceptions import ApiException

        args = (self.group, self.version, self.namespace, self.plural)
        what = f"{obj.get('kind', self.plural)} {self.namespace}/{self.name}"
        try:
            try:
                api.patch_namespaced_custom_object(*args, self.name, obj)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                api.create_namespaced_custom_object(*args, obj)
        except ApiException as exc:
            raise ExternalToolError(f"applying {what} failed: {exc.status} {exc.reason}", tool="kubernetes") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ExternalToolError(f"applying {what} failed: {exc}", tool="kubernetes") from None


class GatewayDataPlane:
    kind = "gateway-api"
    capabilities: ClassVar[frozenset[Capability]] = PLANES["gateway-api"].capabilities

    def __init__(self, spec: GatewaySpec) -> None:
        self.spec = spec
        if spec.kubeconfig is None and spec.output is None:
            raise BadInputError("the gateway-api data plane needs gateway.kubeconfig or gateway.output",
                                field="gateway")
        self.object = None if spec.kubeconfig is None else CustomObject(
            spec.kubeconfig, spec.context, GROUP, VERSION, PLURAL, spec.namespace, spec.route_name)

    def weights(self) -> dict[str, int] | None:
        route: dict[str, Any] | None = None
        if self.object is not None:
            route = self.object.get()
        elif self.spec.output is not None and Path(self.spec.output).exists():
            route = read_yaml(Path(self.spec.output))
        if not route:
            return None
        refs = route["spec"]["rules"][0]["backendRefs"]
        by_service = {ref.name: v for v, ref in self.spec.backends.items()}
        return {by_service.get(r["name"], r["name"]): int(r.get("weight", 1)) for r in refs}

    def set_weights(self, weights: dict[str, int]) -> None:
        route = render_httproute(self.spec, weights)
        validate_httproute(route)
        if self.spec.output is not None:
            write_yaml(self.spec.output, route)
        if self.object is not None:
            self.object.apply(route)

    def backend_urls(self) -> dict[str, str]:
        return {}


def make_gateway_plane(spec: RolloutSpec, *, router_token: str | None) -> GatewayDataPlane:
    assert spec.gateway is not None
    return GatewayDataPlane(spec.gateway)
