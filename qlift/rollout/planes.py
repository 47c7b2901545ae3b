"""The data planes as data: one entry per place the weights can live.

An entry names the spec section holding its settings, the evidence source a rollout reads by
default on it, and the Prometheus preset whose series describe its traffic (how to build each
plane: ``dataplane.MAKERS``). ``RolloutSpec.data_plane``'s choices, ``--data-plane``, the
collector and the Prometheus default all read this table; it imports nothing of the rollout.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, get_args

# Every plane's name: ``RolloutSpec.data_plane``'s choices (and so --data-plane's). PLANES below has one
# entry per name, checked at import; dataplane.MAKERS builds each.
PlaneName = Literal["builtin", "nginx", "gateway-api", "inference-ext"]


class Capability(StrEnum):
    """What a plane can do beyond reading and setting weights; the rollout asks these, never the plane's name."""

    MIRROR = "mirror"  # copies a share of live requests to another version and files both answers (a shadow phase)


class SourceName(StrEnum):
    """An evidence source's name, as a window's ``source`` is journaled and shown."""

    ROUTER = "router"
    NGINX_ACCESS_LOG = "nginx-access-log"
    PROMETHEUS = "prometheus"
    SHADOW = "shadow"  # a shadow window's answer pairs
    NONE = "none"  # no request counts (vLLM /metrics at most), or no evidence this window: no traffic measure


@dataclass(frozen=True)
class PlaneKind:
    name: PlaneName
    section: str | None  # the RolloutSpec field with this plane's settings
    evidence: SourceName  # the default evidence source's
    prometheus_preset: str  # qlift.rollout.prometheus.PRESETS key for --prometheus
    doc: str
    sees_answers: bool = False  # its default evidence carries answers' text (the answer checks can run)
    capabilities: frozenset[Capability] = frozenset()  # what its class declares (DataPlane.capabilities)


PLANES: dict[str, PlaneKind] = {p.name: p for p in (
    PlaneKind("builtin", None, SourceName.ROUTER, "router",
              "The qlift router: weights through its admin API; evidence from its request log.", sees_answers=True,
              capabilities=frozenset({Capability.MIRROR})),
    PlaneKind("nginx", "nginx", SourceName.NGINX_ACCESS_LOG, "nginx",
              "nginx rendered into its own prefix dir and reloaded; evidence from its JSON access log."),
    PlaneKind("gateway-api", "gateway", SourceName.NONE, "vllm",
              "A Gateway API HTTPRoute's backendRefs weights; evidence from Prometheus or vLLM /metrics."),
    PlaneKind("inference-ext", "inference_ext", SourceName.NONE, "vllm",
              "The Gateway API Inference Extension's InferenceModelRewrite: weights per served model (a base and "
              "its LoRA adapter on one Deployment); evidence from Prometheus."),
)}
if tuple(PLANES) != get_args(PlaneName):
    raise AssertionError(f"planes table {tuple(PLANES)} != PlaneName {get_args(PlaneName)}")
