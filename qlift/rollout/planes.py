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
    sees_answers: bool = False  # its default evidence carries answers' text (the answer checks can run)


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


def _inference_ext(spec: RolloutSpec) -> Any:
    from qlift.rollout.inference_ext import InferenceExtDataPlane

    assert spec.inference_ext is not None
    return InferenceExtDataPlane(spec.inference_ext, {v: spec.served_model(v) for v in (spec.stable, spec.canary)})


PLANES: dict[str, PlaneKind] = {p.name: p for p in (
    PlaneKind("builtin", None, _builtin, "router", "router",
              "The qlift router: weights through its admin API; evidence from its request log.", sees_answers=True),
    PlaneKind("nginx", "nginx", _nginx, "nginx-access-log", "nginx",
              "nginx rendered into its own prefix dir and reloaded; evidence from its JSON access log."),
    PlaneKind("gateway-api", "gateway", _gateway, "none", "vllm",
              "A Gateway API HTTPRoute's backendRefs weights; evidence from Prometheus or vLLM /metrics."),
    PlaneKind("inference-ext", "inference_ext", _inference_ext, "none", "vllm",
              "The Gateway API Inference Extension's InferenceModelRewrite: weights per served model (a base and "
              "its LoRA adapter on one Deployment); evidence from Prometheus."),
)}


def make_plane(spec: RolloutSpec) -> Any:
    return PLANES[spec.data_plane].make(spec)
