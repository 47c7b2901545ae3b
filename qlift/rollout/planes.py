"""The data planes as data: one entry per place the weights can live.

An entry names the spec section holding its settings, how to build the plane, the evidence
source a rollout reads by default on it, and the Prometheus preset whose series describe its
traffic. ``RolloutSpec.data_plane``'s choices, ``--data-plane``, the collector and the
Prometheus default all read this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qlift.rollout.spec import RolloutSpec


@dataclass(frozen=True)
class PlaneKind:
    name: str
    section: str | None  # the RolloutSpec field with this plane's settings
    make: Callable[[RolloutSpec], Any]  # -> a DataPlane (qlift.rollout.dataplane)
    evidence: str  # the default evidence source's name
    prometheus_preset: str  # qlift.rollout.prometheus.PRESETS key for --prometheus
    doc: str


def _builtin(spec: RolloutSpec) -> Any:
    from qlift.rollout.dataplane import RouterDataPlane
    from qlift.settings import router_token

    assert spec.router is not None
    return RouterDataPlane(spec.router, router_token())


def _nginx(spec: RolloutSpec) -> Any:
    from qlift.rollout.nginx import NginxDataPlane

    assert spec.nginx is not None
    return NginxDataPlane(spec.nginx, {v: spec.backends[v] for v in (spec.stable, spec.canary)})


def _gateway(spec: RolloutSpec) -> Any:
    from qlift.rollout.gateway import GatewayDataPlane

    assert spec.gateway is not None
    return GatewayDataPlane(spec.gateway)


PLANES: dict[str, PlaneKind] = {p.name: p for p in (
    PlaneKind("builtin", None, _builtin, "router", "router",
              "The qlift router: weights through its admin API; evidence from its request log."),
    PlaneKind("nginx", "nginx", _nginx, "nginx-access-log", "nginx",
              "nginx rendered into its own prefix dir and reloaded; evidence from its JSON access log."),
    PlaneKind("gateway-api", "gateway", _gateway, "none", "vllm",
              "A Gateway API HTTPRoute's backendRefs weights; evidence from Prometheus or vLLM /metrics."),
)}


def plane_names() -> list[str]:
    return list(PLANES)


def make_plane(spec: RolloutSpec) -> Any:
    return PLANES[spec.data_plane].make(spec)
