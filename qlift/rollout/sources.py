"""Evidence sources and the collector that runs them over one window.

``RouterSource`` reads the qlift router's per-attempt request log (``/admin/requests``)
between two sequence numbers, so both versions are judged over exactly the same requests'
time span; ``AccessLogSource`` (nginx.py) and ``PrometheusSource`` (prometheus.py) are the
others. vLLM's /metrics of each backend is read beside whichever is primary.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Protocol, runtime_checkable

from qlift.errors import BadInputError
from qlift.rollout.evidence import NO_PRIMARY, Evidence, VersionEvidence, from_request_records
from qlift.rollout.planes import SourceName
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.vllm_metrics import VllmMetricsReader, fill_from_vllm
from qlift.router.wire import RequestBatch, RequestRecord

log = logging.getLogger(__name__)


class EvidenceSource(Protocol):
    name: str

    def begin(self) -> None: ...

    def collect(self) -> dict[str, VersionEvidence]:
        """The whole window since ``begin`` (or the last collect)."""

    def peek(self) -> dict[str, VersionEvidence] | None:
        """The window so far, without ending it; None when the source cannot tell before the end."""


@runtime_checkable
class NotedSource(EvidenceSource, Protocol):
    """A source whose last window carries notes the window record should say (Prometheus: series not found)."""

    notes: list[str]


def source_notes(source: EvidenceSource) -> list[str]:
    return list(source.notes) if isinstance(source, NotedSource) else []


class RouterSource:
    name: str = SourceName.ROUTER

    def __init__(self, url: str, token: str | None, versions: list[str]) -> None:
        from qlift.router.client import RouterClient

        self.client = RouterClient(url, token)
        self.versions = versions
        self.cursor = 0
        self.records: list[RequestRecord] = []

    def begin(self) -> None:
        self.cursor = self.client.state().seq
        self.records = []

    def poll(self) -> None:
        """Add the records logged since the last poll (the cursor is this router's own sequence number)."""
        batch: RequestBatch = self.client.requests(since=self.cursor)
        if batch.requests and batch.requests[0].seq > self.cursor + 1:
            log.warning("the router's request log dropped %d records in this window (ring buffer)",
                        batch.requests[0].seq - self.cursor - 1)
        self.records.extend(batch.requests)
        self.cursor = batch.seq

    def peek(self) -> dict[str, VersionEvidence]:
        self.poll()
        return fold_records(self.records, self.versions)

    def collect(self) -> dict[str, VersionEvidence]:
        self.poll()
        out = fold_records(self.records, self.versions)
        self.records = []
        return out


def fold_records(records: list[RequestRecord], versions: list[str]) -> dict[str, VersionEvidence]:
    """Request records (of one router or of several) as each version's evidence."""
    per_backend: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        per_backend[r.backend].append(r)
    return {v: from_request_records(v, per_backend.get(v, [])) for v in versions}


class Collector:
    """The primary source plus each backend's vLLM /metrics, begun and read together."""

    def __init__(self, primary: EvidenceSource, stable: str, canary: str, vllm: VllmMetricsReader | None) -> None:
        self.primary, self.stable, self.canary, self.vllm = primary, stable, canary, vllm
        self.started = 0.0

    def begin(self) -> None:
        self.started = time.time()
        self.primary.begin()
        if self.vllm is not None:
            self.vllm.begin()

    def peek(self) -> Evidence | None:
        per_version = self.primary.peek()
        if per_version is None:
            return None
        return Evidence(per_version.get(self.stable, VersionEvidence(self.stable)),
                        per_version.get(self.canary, VersionEvidence(self.canary)),
                        started_at=self.started, ended_at=time.time(), source=self.primary.name)

    def collect(self) -> Evidence:
        per_version = self.primary.collect()
        engine = self.vllm.collect() if self.vllm is not None else {}
        ev = Evidence(per_version.get(self.stable, VersionEvidence(self.stable)),
                      per_version.get(self.canary, VersionEvidence(self.canary)),
                      started_at=self.started, ended_at=time.time(), source=self.primary.name,
                      notes=source_notes(self.primary))
        for version_ev in (ev.stable, ev.canary):
            if version_ev.version in engine:
                fill_from_vllm(version_ev, engine[version_ev.version])
        if engine:
            ev.source += "+vllm"
        return ev


class SourceMaker(Protocol):
    """How a data plane's default evidence source is built; given the router's admin token (None: none)."""

    def __call__(self, spec: RolloutSpec, versions: list[str], *, router_token: str | None) -> EvidenceSource: ...


def _router_source(spec: RolloutSpec, versions: list[str], *, router_token: str | None) -> EvidenceSource:
    if spec.routers is not None:  # every router of a fleet (fleet.py)
        from qlift.rollout.fleet import FleetSource, RouterFleet

        return FleetSource(RouterFleet(spec.routers, also=spec.router), router_token, versions)
    if not spec.router:
        return _NoPrimary(versions)
    return RouterSource(spec.router, router_token, versions)


def _access_log_source(spec: RolloutSpec, versions: list[str], *, router_token: str | None) -> EvidenceSource:
    from qlift.rollout.nginx import AccessLogSource

    assert spec.nginx is not None
    return AccessLogSource(spec.nginx.prefix, {v: spec.backends[v] for v in versions})


def _none_source(spec: RolloutSpec, versions: list[str], *, router_token: str | None) -> EvidenceSource:
    return _router_source(spec, versions, router_token=router_token) if spec.router else _NoPrimary(versions)


# A data plane's default evidence source (qlift.rollout.planes.PLANES[...].evidence) -> how to build it.
SOURCES: dict[SourceName, SourceMaker] = {
    SourceName.ROUTER: _router_source, SourceName.NGINX_ACCESS_LOG: _access_log_source, SourceName.NONE: _none_source,
}


def make_collector(spec: RolloutSpec, backend_urls: dict[str, str], *, router_token: str | None) -> Collector:
    """The spec's evidence: Prometheus where it names it, else its data plane's default source (the router's
    admin token, None: none, reaches the router's request log), with the versions' vLLM /metrics beside."""
    from qlift.rollout.planes import PLANES

    versions = [spec.stable, spec.canary]
    primary: EvidenceSource
    if spec.provider == SourceName.PROMETHEUS:
        from qlift.rollout.nginx import host_port
        from qlift.rollout.prometheus import PrometheusSource

        assert spec.prometheus is not None
        urls = {**backend_urls, **spec.backends}
        instances = {v: host_port(urls[v].partition("#")[0]) for v in versions if v in urls}
        if len(instances) == 2 and len(set(instances.values())) == 1 and not spec.prometheus.queries:
            raise BadInputError(
                f"stable and canary are one server ({instances[spec.stable]}): vLLM's series label an adapter's "
                "requests with the base's model name, so no preset can tell the two versions apart",
                field="prometheus", hint="Judge on the router's own records (leave out --prometheus), or give "
                "prometheus.queries over your gateway's per-model series (docs/lora.md).")
        primary = PrometheusSource(spec.prometheus, versions, spec.models, spec.interval, instances)
    else:
        primary = SOURCES[PLANES[spec.data_plane].evidence](spec, versions, router_token=router_token)
    urls = {v: u for v, u in {**backend_urls, **spec.backends}.items() if v in versions}
    if len(urls) == 2 and len({u.rstrip("/") for u in urls.values()}) == 1:
        # Both versions are model names on one vLLM server (an adapter and its base): its /metrics are one
        # engine's (labelled with the base's name even for adapter requests), so they are left out rather
        # than compared with themselves; the router's per-backend records are per version.
        urls = {}
        primary = _Noted(primary, SHARED_SERVER_NOTE)
    vllm = VllmMetricsReader(urls) if spec.vllm_metrics and urls else None
    return Collector(primary, spec.stable, spec.canary, vllm)


SHARED_SERVER_NOTE = ("stable and canary are served by one vLLM server: its engine metrics (/metrics) are left out, "
                      "the evidence is the router's per-version records")


class _Noted:
    """A primary source whose windows carry one more note (kept apart from the sources registry: it wraps
    whichever source the data plane chose)."""

    def __init__(self, inner: EvidenceSource, note: str) -> None:
        self.inner, self.note, self.name = inner, note, inner.name

    @property
    def notes(self) -> list[str]:
        return [*source_notes(self.inner), self.note]

    def begin(self) -> None:
        self.inner.begin()

    def collect(self) -> dict[str, VersionEvidence]:
        return self.inner.collect()

    def peek(self) -> dict[str, VersionEvidence] | None:
        return self.inner.peek()


class _NoPrimary:
    """Only vLLM's /metrics (gateway-api without Prometheus): no error counts."""

    name = NO_PRIMARY

    def __init__(self, versions: list[str]) -> None:
        self.versions = versions

    def begin(self) -> None:
        pass

    def collect(self) -> dict[str, VersionEvidence]:
        return {v: VersionEvidence(v) for v in self.versions}

    def peek(self) -> None:
        return None
