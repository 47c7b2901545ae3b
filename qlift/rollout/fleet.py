"""A fleet of qlift routers as one data plane (``routers:`` on the builtin plane).

Every router takes every weight (``set_weights`` writes each, raising with the routers it did not reach, so the
journal's intent stays pending and the reconcile loop writes it again); ``weights()`` is the weights they all hold,
or ``WeightsSplit`` naming who holds what (the window is void and every router gets the journal's weights), or an
error naming the routers that do not answer (the rollout holds). Evidence is merged from all: request records with
a cursor per router (each counts its own sequence numbers), shadow pairs likewise; mirroring is turned on and off on
each. The routers are listed, or the EndpointSlices of a headless Service list them, re-read every window so a
replaced router pod joins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from qlift.errors import BadInputError, ExternalToolError, QliftError
from qlift.rollout.dataplane import RouterDataPlane, ServerAddress, WeightsSplit
from qlift.rollout.evidence import VersionEvidence
from qlift.rollout.planes import PLANES, Capability, SourceName
from qlift.rollout.shadow import Pair, ShadowSource
from qlift.rollout.sources import RouterSource, fold_records
from qlift.rollout.spec_sections import DiscoveredRouters, RouterDiscovery

if TYPE_CHECKING:
    from qlift.rollout.spec import RolloutSpec
    from qlift.router.wire import ShadowState

log = logging.getLogger(__name__)

T = TypeVar("T")
ADMIN_TIMEOUT_S = 5.0  # a router that takes longer to answer its admin API is named as not answering
SERVICE_LABEL = "kubernetes.io/service-name"  # the label an EndpointSlice names its Service by
# Every Kubernetes API call discovery makes, as a Role rule: `qlift deploy k8s --data-plane builtin` grants the
# promote controller exactly this (tests/test_deploy_builtin.py checks it against the requests discovery sends).
DISCOVERY_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}]


class RouterFleet:
    """The routers' URLs: the listed ones, or those a headless Service's EndpointSlices list now."""

    def __init__(self, routers: list[str] | DiscoveredRouters, *, also: str | None = None) -> None:
        self.listed = routers if isinstance(routers, list) else None
        self.discovery = None if isinstance(routers, list) else routers.discover
        self.also = also.rstrip("/") if also else None  # the spec's router:, one more member

    @classmethod
    def of(cls, spec: RolloutSpec) -> RouterFleet | None:
        """The spec's fleet (``routers:``, with ``router:`` one more member); None where it names one router."""
        return None if spec.routers is None else cls(spec.routers, also=spec.router)

    def where(self) -> str:
        """The routers as a person names them: the listed URLs, or the Service whose EndpointSlices list them."""
        if self.discovery is not None:
            return f"the routers of Service {self.discovery.namespace}/{self.discovery.service}"
        return ", ".join(self.urls())

    def urls(self) -> list[str]:
        if self.listed is not None:
            found = list(self.listed)
        else:
            assert self.discovery is not None
            found = discover_routers(self.discovery)
        return found if self.also is None or self.also in found else [*found, self.also]

    def each(self, urls: list[str], call: Callable[[str], T]) -> tuple[dict[str, T], dict[str, str]]:
        """``call`` on every router at once: (url -> its answer, url -> why it failed)."""
        done: dict[str, T] = {}
        failed: dict[str, str] = {}

        def one(url: str) -> None:
            try:
                done[url] = call(url)
            except QliftError as exc:
                failed[url] = exc.one_line()

        with ThreadPoolExecutor(max_workers=min(16, max(1, len(urls)))) as pool:
            list(pool.map(one, urls))
        return done, failed


def not_answering(failed: dict[str, str]) -> str:
    return "; ".join(f"router {url} does not answer ({why})" for url, why in sorted(failed.items()))


def discover_routers(d: RouterDiscovery) -> list[str]:
    """Every router pod's URL in the EndpointSlices of ``d.service`` (ready or not: a router that does not answer
    holds the rollout, never drops out of it), leaving out pods terminating by design."""
    api = _discovery_api(d)
    try:
        slices = api.list_namespaced_endpoint_slice(d.namespace, label_selector=f"{SERVICE_LABEL}={d.service}",
                                                    _request_timeout=ADMIN_TIMEOUT_S)
    except Exception as exc:  # the client raises ApiException, urllib3's and OSError's kinds
        raise ExternalToolError(f"could not list the EndpointSlices of {d.namespace}/{d.service}: "
                                f"{getattr(exc, 'status', '')} {getattr(exc, 'reason', None) or exc}".strip(),
                                tool="kubernetes", hint="Check the kubeconfig and that it may list "
                                "endpointslices in the namespace.") from None
    urls = []
    for s in slices.items:
        port = next((p.port for p in s.ports or [] if p.name == d.port), None)
        if port is None:
            continue
        for e in s.endpoints or []:
            if e.conditions is not None and e.conditions.terminating:
                continue
            urls += [f"http://{f'[{a}]' if ':' in a else a}:{port}" for a in e.addresses]
    if not urls:
        raise ExternalToolError(f"the EndpointSlices of {d.namespace}/{d.service} list no router on a port named "
                                f"{d.port!r}", tool="kubernetes",
                                hint="Check routers.discover (service, namespace, port) against the headless Service.")
    return sorted(set(urls))


def _discovery_api(d: RouterDiscovery) -> Any:
    try:
        from kubernetes import client, config
    except ImportError:
        raise ExternalToolError("routers.discover needs the kubernetes client", hint="pip install 'qlift[gateway]'",
                                tool="kubernetes") from None
    try:
        api_client = config.new_client_from_config(
            config_file=None if d.kubeconfig is None else str(d.kubeconfig.expanduser()), context=d.context)
    except (config.ConfigException, OSError) as exc:
        if d.kubeconfig is not None:
            raise BadInputError(f"cannot use kubeconfig {d.kubeconfig}: {exc}", field="routers.discover.kubeconfig"
                                ) from None
        try:  # no kubeconfig: the pod's own service account
            config.load_incluster_config()
        except config.ConfigException:
            raise BadInputError(f"routers.discover: no kubeconfig and not in a cluster ({exc})",
                                field="routers.discover.kubeconfig") from None
        api_client = client.ApiClient()
    return client.DiscoveryV1Api(api_client)


class FleetDataPlane:
    """Every router of a fleet as one builtin plane."""

    kind = "builtin"
    capabilities: ClassVar[frozenset[Capability]] = PLANES["builtin"].capabilities

    def __init__(self, fleet: RouterFleet, token: str | None) -> None:
        self.fleet, self.token = fleet, token
        self._planes: dict[str, RouterDataPlane] = {}

    def _plane(self, url: str) -> RouterDataPlane:
        if url not in self._planes:
            self._planes[url] = RouterDataPlane(url, self.token)
            self._planes[url].client.timeout = ADMIN_TIMEOUT_S
        return self._planes[url]

    def _all(self, call: Callable[[RouterDataPlane], T]) -> dict[str, T]:
        """``call`` on every router; an error naming each that does not answer."""
        done, failed = self.fleet.each(self.fleet.urls(), lambda url: call(self._plane(url)))
        if failed:
            raise ExternalToolError(not_answering(failed), tool="router",
                                    hint="The rollout holds until every router answers (or the fleet lists it "
                                         "no more).")
        return done

    def _any(self, call: Callable[[RouterDataPlane], T]) -> T:
        """``call`` on the first router that answers (what every router is told alike: its backends)."""
        failed: dict[str, str] = {}
        for url in self.fleet.urls():
            try:
                return call(self._plane(url))
            except QliftError as exc:
                failed[url] = exc.one_line()
        raise ExternalToolError(not_answering(failed), tool="router")

    def weights(self) -> dict[str, int] | None:
        held = self._all(lambda p: p.weights() or {})
        distinct = {tuple(sorted(w.items())) for w in held.values()}
        if len(distinct) > 1:
            raise WeightsSplit("the routers hold different weights: " + "; ".join(
                f"{url} {w}" for url, w in sorted(held.items())), found=held)
        return next(iter(held.values()))

    def set_weights(self, weights: dict[str, int]) -> None:
        urls = self.fleet.urls()
        _, failed = self.fleet.each(urls, lambda url: self._plane(url).set_weights(weights))
        if failed:
            reached = [u for u in urls if u not in failed]
            raise ExternalToolError(f"weights {weights} reached {', '.join(reached) or 'no router'} only: "
                                    f"{not_answering(failed)}", tool="router",
                                    hint="They are written again to every router once it answers.")

    def backend_urls(self) -> dict[str, str]:
        return self._any(lambda p: p.backend_urls())

    def mirroring(self) -> ShadowState | None:
        on = [s for s in self._all(lambda p: p.mirroring()).values() if s is not None]
        return on[0] if on else None

    def mirror(self, *, stable: str, canary: str) -> ShadowSource:
        return FleetShadowSource(self.fleet, self.token, stable=stable, canary=canary)

    def server(self, version: str) -> ServerAddress:
        return self._any(lambda p: p.server(version))

    def backend_models(self) -> dict[str, str]:
        return self._any(lambda p: p.backend_models())

    def generation(self) -> str | None:
        """Changes when any router restarted (or the fleet's members changed)."""
        started = self._all(lambda p: p.generation())
        return " ".join(f"{url}@{at}" for url, at in sorted(started.items()))

    def identity(self, version: str) -> str | None:
        seen = {i for i in self._all(lambda p: p.identity(version)).values() if i is not None}
        return " | ".join(sorted(seen)) or None  # routers that disagree read as a change: the window is not judged

    def down(self, version: str) -> str | None:
        why = {url: w for url, w in self._all(lambda p: p.down(version)).items() if w is not None}
        return "; ".join(f"router {url}: {w}" for url, w in sorted(why.items())) or None

    def check_versions(self, versions: list[str]) -> None:
        self._all(lambda p: p.check_versions(versions))


class FleetSource:
    """Every router's request records over one window, each read from its own cursor."""

    name: str = SourceName.ROUTER

    def __init__(self, fleet: RouterFleet, token: str | None, versions: list[str]) -> None:
        self.fleet, self.token, self.versions = fleet, token, versions
        self.sources: dict[str, RouterSource] = {}

    def begin(self) -> None:
        self.sources = {url: RouterSource(url, self.token, self.versions) for url in self.fleet.urls()}
        _, failed = self.fleet.each(list(self.sources), lambda url: self.sources[url].begin())
        if failed:
            raise ExternalToolError(not_answering(failed), tool="router")

    def _poll(self) -> None:
        _, failed = self.fleet.each(list(self.sources), lambda url: self.sources[url].poll())
        if failed:
            raise ExternalToolError(not_answering(failed), tool="router")

    def peek(self) -> dict[str, VersionEvidence]:
        self._poll()
        return fold_records([r for s in self.sources.values() for r in s.records], self.versions)

    def collect(self) -> dict[str, VersionEvidence]:
        out = self.peek()
        for s in self.sources.values():
            s.records = []
        return out


class FleetShadowSource(ShadowSource):
    """Every router's shadow pairs, each read from its own cursor; mirroring switched on and off on all."""

    def __init__(self, fleet: RouterFleet, token: str | None, *, stable: str = "", canary: str = "") -> None:
        self.fleet, self.token = fleet, token
        self.stable, self.canary = stable, canary
        self.started = 0.0
        self.pending: list[Pair] = []
        self.sources: dict[str, ShadowSource] = {}
        self._seq = 0  # the merged pairs' own numbering: each router's seq counts its pairs alone

    def _routers(self) -> dict[str, ShadowSource]:
        """The fleet now: a router that joined gets a source (its earlier pairs are skipped by the next begin)."""
        urls = self.fleet.urls()
        self.sources = {u: self.sources.get(u) or ShadowSource(u, self.token, stable=self.stable,
                                                                canary=self.canary) for u in urls}
        return self.sources

    def _every(self, call: Callable[[ShadowSource], T]) -> dict[str, T]:
        routers = self._routers()
        done, failed = self.fleet.each(list(routers), lambda url: call(routers[url]))
        if failed:
            raise ExternalToolError(not_answering(failed), tool="router")
        return done

    def start(self, version: str, percent: float, max_inflight: int, *, partner: str | None = None
              ) -> dict[str, Any]:
        self.canary = version
        states = self._every(lambda s: s.start(version, percent, max_inflight, partner=partner))
        return states[min(states)]

    def stop(self) -> None:
        self._every(lambda s: s.stop())

    def begin(self) -> None:
        self._routers()
        super().begin()

    def _fetch(self) -> list[Pair]:
        fetched: dict[str, list[Pair]] = {}
        _, failed = self.fleet.each(list(self.sources),
                                    lambda url: fetched.__setitem__(url, self.sources[url]._fetch()))
        if failed:
            raise ExternalToolError(not_answering(failed), tool="router")
        out = []
        for url in sorted(fetched):
            for p in fetched[url]:
                self._seq += 1
                out.append(Pair(self._seq, p.request, p.primary, p.shadow, p.path))
        return out
