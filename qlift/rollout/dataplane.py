"""Data planes: where the weights live. Each one reads and sets ``{version: percent}``.

``builtin`` is the qlift router's admin API; ``nginx``, ``gateway-api`` and ``inference-ext`` render config
(nginx.py, gateway.py, inference_ext.py). Each is built by the maker its entry in the planes table names
(``qlift.rollout.planes``); the rollout asks a plane only what the protocols below declare.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, cast, runtime_checkable

from qlift.errors import ExternalToolError
from qlift.rollout.planes import PLANES, Capability
from qlift.rollout.spec import RolloutSpec

if TYPE_CHECKING:
    from qlift.rollout.shadow import ShadowSource
    from qlift.router.wire import ShadowState

log = logging.getLogger(__name__)


class WeightsSplit(ExternalToolError):
    """A plane of several parts (a router fleet) whose parts hold different weights: no window is judged while
    they do, and the reconcile loop writes the journal's weights to every part again."""

    def __init__(self, message: str, *, found: dict[str, dict[str, int]]) -> None:
        super().__init__(message, tool="router")
        self.found = found  # part (a router's URL) -> the weights it holds


class DataPlane(Protocol):
    """What every plane does. What some planes can also tell is declared below, one protocol each; the rollout
    asks ``isinstance(plane, Identifies)`` and the like, and a plane without one is handled (never probed).
    ``isinstance`` sees the method's name only: a plane keeps these names for these methods."""

    kind: str
    capabilities: ClassVar[frozenset[Capability]]  # its entry's in the planes table

    def weights(self) -> dict[str, int] | None:
        """The weights in force now (None when they cannot be read)."""

    def set_weights(self, weights: dict[str, int]) -> None:
        """Apply ``weights`` (idempotent: applying the same weights twice is harmless)."""

    def backend_urls(self) -> dict[str, str]:
        """Version name -> base URL of its server, where known (for vLLM /metrics)."""


@runtime_checkable
class Restarts(Protocol):
    def generation(self) -> str | None:
        """Changes when the data plane restarted (its weights and request log may have reset); None: cannot tell."""


@runtime_checkable
class ChecksVersions(Protocol):
    def check_versions(self, versions: list[str]) -> None:
        """Refuse (BadInputError) version names the plane does not have."""


@runtime_checkable
class ReportsDown(Protocol):
    def down(self, version: str) -> str | None:
        """Why the plane keeps ``version`` out of rotation; None while it is up."""


@runtime_checkable
class Identifies(Protocol):
    def identity(self, version: str) -> str | None:
        """What ``version`` serves now (a model hash or dir): changes when another model is loaded under it."""


@dataclass(frozen=True)
class ServerAddress:
    """Where a version's server answers, as its data plane knows it."""

    url: str | None  # None: the plane shows it only redacted (credentials): its own health view is all there is
    model: str | None  # the model name the server must list (None: any)


@runtime_checkable
class KnowsServers(Protocol):
    def server(self, version: str) -> ServerAddress | None:
        """Where ``version``'s server answers (None: the plane does not know)."""


@runtime_checkable
class NamesModels(Protocol):
    def backend_models(self) -> dict[str, str]:
        """Version name -> the model name the plane asks its server for."""


class Mirroring(Protocol):
    """What a plane that declares ``Capability.MIRROR`` provides."""

    def mirror(self, *, stable: str, canary: str) -> ShadowSource:
        """Its mirroring switch and answer pairs for a rollout of ``canary`` against ``stable``."""

    def mirroring(self) -> ShadowState | None:
        """The mirroring in force now (None: none)."""


def mirroring_now(plane: DataPlane) -> ShadowState | None:
    """What the plane mirrors now; None where it mirrors nothing or cannot mirror."""
    return cast(Mirroring, plane).mirroring() if Capability.MIRROR in plane.capabilities else None


def mirror_source(plane: DataPlane, spec: RolloutSpec) -> ShadowSource | None:
    """The plane's mirror for the spec's shadow phase; None without a shadow phase, or where the plane
    does not declare MIRROR (the spec's validation refuses a shadow phase there)."""
    if spec.shadow is None or Capability.MIRROR not in plane.capabilities:
        return None
    return cast(Mirroring, plane).mirror(stable=spec.stable, canary=spec.canary)


def plane_generation(plane: DataPlane) -> str | None:
    """Changes when the data plane restarted (its weights and request log may have reset); None: cannot tell."""
    return plane.generation() if isinstance(plane, Restarts) else None


def check_versions(plane: DataPlane, versions: list[str]) -> None:
    """Refuse version names the data plane does not have, before anything is journaled."""
    if isinstance(plane, ChecksVersions):
        plane.check_versions(versions)


def check_stable_up(plane: DataPlane, stable: str, *, allow_down: bool) -> None:
    """Refuse a new rollout while the data plane reports the stable down: its users already go elsewhere
    (the canary, at any weight), and the judge would compare the canary with no stable traffic."""
    why = plane.down(stable) if isinstance(plane, ReportsDown) else None
    if why is None:
        return
    message = f"the router reports the stable {stable} DOWN ({why})"
    if allow_down:
        log.warning("%s: starting anyway (--allow-stable-down)", message)
        return
    raise ExternalToolError(f"{message}: its users already go to the other backends and the judge would compare "
                            "the canary with no stable traffic", tool="router",
                            hint="Bring the stable's server back first, or pass --allow-stable-down.")


class RouterDataPlane:
    """The qlift router: ``PUT /admin/weights`` applies atomically to new requests."""

    kind = "builtin"
    capabilities: ClassVar[frozenset[Capability]] = PLANES["builtin"].capabilities

    def __init__(self, url: str, token: str | None) -> None:
        from qlift.router.client import RouterClient

        self.url, self.token = url, token
        self.client = RouterClient(url, token)

    def mirror(self, *, stable: str, canary: str) -> ShadowSource:
        """``PUT``/``DELETE /admin/shadow`` and ``GET /admin/shadow``'s answer pairs."""
        from qlift.rollout.shadow import ShadowSource

        return ShadowSource(self.url, self.token, stable=stable, canary=canary)

    def weights(self) -> dict[str, int] | None:
        return dict(self.client.state().weights)

    def set_weights(self, weights: dict[str, int]) -> None:
        state = self.client.set_weights(weights)
        if any(state.weights.get(k) != v for k, v in weights.items()):
            raise ExternalToolError(f"router answered weights {state.weights} after PUT {weights}", tool="router")

    def backend_urls(self) -> dict[str, str]:
        return {b.name: b.url for b in self.client.state().backends}

    def mirroring(self) -> ShadowState | None:
        return self.client.state().shadow

    def server(self, version: str) -> ServerAddress:
        b = self.client.state().backend(version)
        redacted = "***@" in b.url  # qlift.router.config.redact_url's mark: the credentials are not ours to see
        return ServerAddress(None if redacted else b.url, b.served_model or None)

    def backend_models(self) -> dict[str, str]:
        """Version name -> the model name the router asks its server for (``NAME=URL#MODEL``)."""
        return {b.name: b.served_model for b in self.client.state().backends if b.served_model}

    def generation(self) -> str | None:
        return self.client.state().started_at

    def identity(self, version: str) -> str | None:
        return self.client.state().backend(version).identity

    def down(self, version: str) -> str | None:
        """Why the router keeps ``version`` out of rotation; None while it is up."""
        b = self.client.state().backend(version)
        return None if b.healthy else (b.problem or "its /health check fails")

    def check_versions(self, versions: list[str]) -> None:
        from qlift.errors import BadInputError

        names = [b.name for b in self.client.state().backends]
        missing = [v for v in versions if v not in names]
        if missing:
            raise BadInputError(f"router at {self.client.url} has no backend named {', '.join(missing)} "
                                f"(it has {', '.join(names) or 'none'})", field="--stable/--canary",
                                hint="Pass the router's backend names (`qlift router --backend NAME=URL`).")


class PlaneMaker(Protocol):
    """What a plane's entry names as its maker (PlaneKind.maker). Each is given the router's admin token (None:
    none); the qlift router's uses it."""

    def __call__(self, spec: RolloutSpec, *, router_token: str | None) -> DataPlane: ...


def make_router_plane(spec: RolloutSpec, *, router_token: str | None) -> DataPlane:
    """The qlift router at ``router:``, or every router of ``routers:`` as one plane (fleet.py)."""
    if spec.routers is not None:
        from qlift.rollout.fleet import FleetDataPlane, RouterFleet

        return FleetDataPlane(RouterFleet(spec.routers, also=spec.router), router_token)
    assert spec.router is not None
    return RouterDataPlane(spec.router, router_token)


def make_data_plane(spec: RolloutSpec, *, router_token: str | None) -> DataPlane:
    """The spec's data plane, built by the maker its entry in the planes table names."""
    return PLANES[spec.data_plane].load_maker()(spec, router_token=router_token)
