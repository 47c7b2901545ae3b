"""The data planes as data: one entry per place the weights can live.

An entry names the spec section holding its settings and that section's model, the function that builds the
plane, the evidence source a rollout reads by default on it, the Prometheus preset whose series describe its
traffic, and what the spec and `--canary-adapter` ask of it. ``RolloutSpec.data_plane``'s choices and its
section rules, ``--data-plane``, the plane and the collector a rollout builds, the Prometheus default and the
exporter all read this table; a new plane is one ``register_plane`` entry and the module its maker names.
"""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import ValidatorFunctionWrapHandler, WrapValidator

from qlift.rollout.spec_sections import GatewaySpec, InferenceExtSpec, NginxSpec, PlaneSection

if TYPE_CHECKING:
    from qlift.rollout.dataplane import PlaneMaker

# The shipped planes' names: ``--data-plane``'s choices. PLANES below has one entry per name, checked at import;
# a plane registered since (``register_plane``) is taken by the spec too (``PlaneChoice``).
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
class AdapterRefusal:
    """Why `--canary-adapter` cannot run on a plane, where it says more than the general refusal."""

    message: str
    hint: str


@dataclass(frozen=True)
class PlaneKind:
    name: str
    section: str | None  # the spec's key with this plane's settings (None: it has none)
    settings: type[PlaneSection] | None  # that section's model
    maker: str  # "module:function" that builds the plane: (RolloutSpec, *, router_token) -> DataPlane
    evidence: SourceName  # the default evidence source's
    prometheus_preset: str  # qlift.rollout.prometheus.PRESETS key for --prometheus
    doc: str
    section_needed: str = ""  # how a refusal names the missing section (default: "a SECTION: section")
    at_router: bool = False  # the plane is the qlift router at router: (which it needs); status shows its weights
    adapter_refusal: AdapterRefusal | None = None
    sees_answers: bool = False  # its default evidence carries answers' text (the answer checks can run)
    capabilities: frozenset[Capability] = frozenset()  # what its class declares (DataPlane.capabilities)

    @property
    def missing_section(self) -> str:
        return f"data_plane {self.name} needs {self.section_needed or f'a {self.section}: section'}"

    def load_maker(self) -> PlaneMaker:
        maker: PlaneMaker = pkgutil.resolve_name(self.maker)
        return maker


PLANES: dict[str, PlaneKind] = {}


def register_plane(plane: PlaneKind) -> PlaneKind:
    """Add ``plane`` to the table: the spec takes its name and its section, and a rollout builds it with its
    maker. A name or section another plane has is refused."""
    taken = [p.name for p in PLANES.values() if p.name == plane.name or (plane.section and p.section == plane.section)]
    if taken:
        raise ValueError(f"plane {plane.name!r}: {taken[0]!r} has that name or section already")
    PLANES[plane.name] = plane
    return plane


def _registered(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    return value if isinstance(value, str) and value in PLANES else handler(value)


# ``RolloutSpec.data_plane``'s type: a shipped plane's name (the Literal gives the flag its choices and the
# error its words), or a registered one's.
PlaneChoice = Annotated[PlaneName, WrapValidator(_registered)]

NGINX_ADAPTER_REFUSAL = AdapterRefusal(
    "--canary-adapter needs the builtin router: nginx splits traffic by upstream (host:port), and stable and canary "
    "are one server here, told apart only by the request body's model, which plain nginx cannot read",
    "Use --data-plane builtin with `qlift router --backend stable=URL#BASE --backend canary=URL#ADAPTER` "
    "(docs/lora.md).")

for _plane in (
    PlaneKind("builtin", None, None, "qlift.rollout.dataplane:make_router_plane", SourceName.ROUTER, "router",
              "The qlift router: weights through its admin API; evidence from its request log.", at_router=True,
              sees_answers=True, capabilities=frozenset({Capability.MIRROR})),
    PlaneKind("nginx", "nginx", NginxSpec, "qlift.rollout.nginx:make_nginx_plane", SourceName.NGINX_ACCESS_LOG,
              "nginx", "nginx rendered into its own prefix dir and reloaded; evidence from its JSON access log.",
              section_needed="an nginx: section (prefix, listen)", adapter_refusal=NGINX_ADAPTER_REFUSAL),
    PlaneKind("gateway-api", "gateway", GatewaySpec, "qlift.rollout.gateway:make_gateway_plane", SourceName.NONE,
              "vllm", "A Gateway API HTTPRoute's backendRefs weights; evidence from Prometheus or vLLM /metrics."),
    PlaneKind("inference-ext", "inference_ext", InferenceExtSpec,
              "qlift.rollout.inference_ext:make_inference_ext_plane", SourceName.NONE, "vllm",
              "The Gateway API Inference Extension's InferenceModelRewrite: weights per served model (a base and "
              "its LoRA adapter on one Deployment); evidence from Prometheus.",
              section_needed="an inference_ext: section"),
):
    register_plane(_plane)
if tuple(PLANES) != get_args(PlaneName):
    raise AssertionError(f"planes table {tuple(PLANES)} != PlaneName {get_args(PlaneName)}")
