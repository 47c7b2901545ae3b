"""The parts of a rollout spec the data planes and evidence sources read on their own: durations, and the
sections of Prometheus, nginx, Gateway API and the Inference Extension (re-exported by ``qlift.rollout.spec``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """'30s', '2m', '500ms', '1h' or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration such as 30s, 2m or 500ms")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise ValueError(f"'{value}' is not a duration such as 30s, 2m or 500ms")
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


# In a file a duration is written as a string ("20s"); its JSON Schema says so, as the loader accepts it.
DURATION_SCHEMA = {"anyOf": [{"type": "string", "pattern": _DURATION.pattern,
                              "description": "a duration such as 30s, 2m, 500ms or 1h"},
                             {"type": "number", "exclusiveMinimum": 0, "description": "seconds"}]}
Duration = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(DURATION_SCHEMA)]


class StrictSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class RolledVersions:
    """The versions a rollout moves, with what the spec says of them: base URLs (``backends``) and served model
    names (``models``)."""

    stable: str
    canary: str
    backends: Mapping[str, str]
    models: Mapping[str, str]

    def missing(self, known: Mapping[str, object]) -> list[str]:
        return [v for v in (self.stable, self.canary) if v not in known]


class PlaneSection(StrictSpec):
    """A data plane's settings section (its entry in qlift.rollout.planes names it); the spec asks it these
    when its plane is the rollout's. A ValueError says which rule is broken."""

    def check(self) -> None:
        """The section's rules alone."""

    def check_versions(self, versions: RolledVersions) -> None:
        """The section's rules with the versions it rolls out."""


class PrometheusSpec(StrictSpec):
    """A Prometheus server that scrapes the router (and backends), queried with PromQL."""

    url: str = Field(description="Base URL of the Prometheus server, e.g. http://127.0.0.1:9090.")
    preset: Literal["router", "vllm", "nginx"] | None = Field(
        None, description="Shipped query set: the qlift router's series, vLLM's own by model name, or vLLM's own "
        "by scrape instance (nginx: both versions serve one model name). Default: the data plane's.")
    queries: dict[str, str] = Field(
        default_factory=dict,
        description="PromQL per evidence field, overriding the preset; $backend, $model and $window are filled in.")
    timeout_s: Duration = Field(10.0, description="Timeout of one query.")


class NginxSpec(PlaneSection):
    """nginx as the data plane: qlift renders the split into its own prefix dir and reloads."""

    prefix: Path = Field(description="nginx prefix dir (nginx.conf, logs, temp dirs, pid live here).")
    listen: str = Field("127.0.0.1:8080", description="Address nginx listens on.")
    session_key: str = Field(
        "$http_x_session_id", description="nginx variable(s) hashed for the sticky split (with $request_id).")
    binary: str = Field("nginx", description="The nginx executable.")
    max_answer_s: Duration = Field(
        600.0, description="The longest answer a client waits for: nginx's proxy_read_timeout, and how long a "
        "reload lets old workers finish their in-flight streams (worker_shutdown_timeout).")
    client_keepalive_s: Duration | None = Field(
        None, description="Keep client connections alive this long between requests (nginx keepalive_timeout). "
        "Off by default: a reload closes idle kept-alive connections under clients that reuse them, and "
        "their next request fails without nginx ever logging it.")
    expose_backend_header: bool = Field(
        False, description="Send X-Qlift-Backend (the upstream address that answered) with every answer. Off: "
        "a client never learns which version answered it (the access log has it).")

    def check_versions(self, versions: RolledVersions) -> None:
        missing = versions.missing(versions.backends)
        if missing:
            raise ValueError(f"data_plane nginx needs backends: URLs for {', '.join(missing)}")


class BackendRef(StrictSpec):
    name: str = Field(description="Kubernetes Service name of this version.")
    port: int = Field(8000, ge=1, le=65535, description="Service port.")


class ParentRef(StrictSpec):
    name: str
    namespace: str | None = None
    sectionName: str | None = None  # noqa: N815  (the Gateway API field name)


class GatewaySpec(PlaneSection):
    """Gateway API as the data plane: an HTTPRoute whose backendRefs carry the weights."""

    route_name: str = Field("qlift-llm", description="metadata.name of the HTTPRoute.")
    namespace: str = Field("default", description="Namespace of the HTTPRoute.")
    parent_refs: list[ParentRef] = Field(description="Gateways the route attaches to.")
    hostnames: list[str] = Field(default_factory=list, description="Host names the route matches.")
    path_prefix: str = Field("/v1", description="Path prefix the route matches.")
    backends: dict[str, BackendRef] = Field(description="Service per version name (stable and canary).")
    kubeconfig: Path | None = Field(None, description="Apply to this cluster with the kubernetes client.")
    context: str | None = Field(None, description="kubeconfig context.")
    output: Path | None = Field(None, description="Also write the rendered HTTPRoute YAML here (GitOps).")

    def check_versions(self, versions: RolledVersions) -> None:
        missing = versions.missing(self.backends)
        if missing:
            raise ValueError(f"gateway.backends lacks {', '.join(missing)}")


class InferenceExtSpec(PlaneSection):
    """The Gateway API Inference Extension as the data plane: the InferenceModelRewrite that `qlift deploy k8s
    --lora NAME=DIR --gateway-api` renders, whose targets' weights split one public model name between the
    models one Deployment serves (a base and its LoRA adapters)."""

    app: str = Field("llm", description="`qlift deploy k8s --name`: the rewrite is APP-rewrite, on pool APP-pool.")
    namespace: str = Field("default", description="Namespace of the InferenceModelRewrite.")
    public_model: str | None = Field(
        None, description="The model name clients send, which the rewrite splits (default: app, as deploy does).")
    models: dict[str, str] = Field(
        default_factory=dict, description="Version name -> served model name it rewrites to (default: the "
        "rollout's models:, else the #MODEL of its backends: NAME=URL#MODEL, else the version name).")
    kubeconfig: Path | None = Field(None, description="Apply to this cluster with the kubernetes client.")
    context: str | None = Field(None, description="kubeconfig context.")
    output: Path | None = Field(None, description="Also write the rendered InferenceModelRewrite YAML here (GitOps).")

    def check(self) -> None:
        if self.kubeconfig is None and self.output is None:
            raise ValueError("data_plane inference-ext needs inference_ext.kubeconfig or inference_ext.output")

    def check_versions(self, versions: RolledVersions) -> None:
        served = {self.served_model(v, versions.backends, versions.models) for v in (versions.stable, versions.canary)}
        if len(served) == 1:
            raise ValueError(f"stable and canary both rewrite to model {served.pop()!r}: set inference_ext.models")

    def served_model(self, version: str, backends: Mapping[str, str], models: Mapping[str, str]) -> str:
        """The model name ``version`` is served as on the pool: this section's models:, the spec's, the #MODEL
        of its ``backends`` URL, else its own name."""
        fragment = backends.get(version, "").partition("#")[2]
        return self.models.get(version) or models.get(version) or fragment or version




class RouterDiscovery(StrictSpec):
    """Where a rollout finds its qlift routers: the EndpointSlices of a headless Service (`qlift deploy k8s
    --data-plane builtin` renders APP-router-fleet), re-read every window."""

    service: str = Field(description="The headless Service whose EndpointSlices list every router pod.")
    namespace: str = Field("default", description="Its namespace.")
    port: str = Field("http", description="The EndpointSlice port's name the routers answer on.")
    kubeconfig: Path | None = Field(None, description="kubeconfig to read it with (default: $KUBECONFIG or "
                                    "~/.kube/config, else the pod's own service account in the cluster).")
    context: str | None = Field(None, description="kubeconfig context.")


class DiscoveredRouters(StrictSpec):
    discover: RouterDiscovery


def _router_list(value: Any) -> Any:
    if isinstance(value, list):
        urls = [str(u).rstrip("/") for u in value]
        if not urls or len(set(urls)) != len(urls):
            raise ValueError("routers: lists each router's URL once (at least one)")
        if bad := [u for u in urls if not u.startswith(("http://", "https://"))]:
            raise ValueError(f"routers: {bad[0]} is not an http:// or https:// URL")
        return urls
    return value


# `routers:` a list of router URLs, or {discover: {service, namespace}}: every router a rollout drives.
Routers = Annotated[list[str] | DiscoveredRouters, BeforeValidator(_router_list)]
