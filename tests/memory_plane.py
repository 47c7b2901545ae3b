"""A data plane added as a new one is: this module and one ``register_plane(KIND)`` (test_rollout_planes.py).

Its weights live in a dict of this process (``STORES``, by the section's ``store``), its settings in the
spec's ``memory:`` section; it knows each version's server, so preflight probes the canary's."""

from __future__ import annotations

from typing import ClassVar, cast

from pydantic import Field

from qlift.rollout.dataplane import DataPlane, ServerAddress
from qlift.rollout.planes import Capability, PlaneKind, SourceName
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.spec_sections import PlaneSection, RolledVersions

STORES: dict[str, dict[str, int]] = {}


class MemorySpec(PlaneSection):
    store: str = Field("default", description="Key of STORES holding the weights.")
    servers: dict[str, str] = Field(description="Version name -> base URL of its server (#MODEL: the model).")

    def check_versions(self, versions: RolledVersions) -> None:
        missing = versions.missing(self.servers)
        if missing:
            raise ValueError(f"memory.servers lacks {', '.join(missing)}")


class MemoryDataPlane:
    kind = "memory"
    capabilities: ClassVar[frozenset[Capability]] = frozenset()

    def __init__(self, section: MemorySpec) -> None:
        self.section = section
        self.store = STORES.setdefault(section.store, {})

    def weights(self) -> dict[str, int] | None:
        return dict(self.store) or None

    def set_weights(self, weights: dict[str, int]) -> None:
        self.store.clear()
        self.store.update(weights)

    def backend_urls(self) -> dict[str, str]:
        return {}

    def server(self, version: str) -> ServerAddress | None:
        url = self.section.servers.get(version)
        return ServerAddress(url, url.partition("#")[2] or None) if url else None


def make_memory_plane(spec: RolloutSpec, *, router_token: str | None) -> DataPlane:
    return MemoryDataPlane(cast(MemorySpec, spec.plane_section(KIND)))


KIND = PlaneKind("memory", "memory", MemorySpec, f"{__name__}:make_memory_plane", SourceName.NONE, "vllm",
                 "Weights in a dict of the test process.")
