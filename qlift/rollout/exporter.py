"""promote's state as Prometheus series (``promote start --metrics-port``), as Argo Rollouts' controller exports
its own, so a dashboard can annotate a rollout's decisions; and, on the nginx data plane, nginx's own responses
by status class, which no other series shows (vLLM does not count what nginx answers itself, 502s included).

Everything is read at each scrape from what the controller already writes: the journal (state, step, weight,
every window's decision) and, for nginx, its access log under the rollout's prefix. The controller is not
touched, so the series cannot disagree with ``promote status``.

Series (``rollout`` is the journal's rollout id):
  qlift_rollout_info{rollout,stable,canary,state,data_plane}   1 for the journal's latest rollout
  qlift_rollout_canary_weight{rollout}                         percent, the last weight change journaled
  qlift_rollout_step{rollout}                                  index into the spec's steps
  qlift_rollout_interval_seconds{rollout,canary}               the analysis window (--interval)
  qlift_rollout_windows_total{rollout,canary,action}           windows judged, by decision (advance, hold, ...)
  qlift_rollout_canary_down{rollout,canary,reason}             1 while the last window found the canary out of
                                                               the router's rotation (reason: the router's), else 0
  qlift_rollout_bake_windows_left{rollout,canary}              --bake: passing windows at 100% still needed
  qlift_rollout_bake_windows_total{rollout,canary,action}      --bake: bake windows judged, by decision
  qlift_nginx_responses_total{pool,status_class}               what nginx answered, by the version it chose
  qlift_nginx_upstream_responses_total{upstream,status_class}   each attempt on a server (host:port), retries too
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qlift.errors import QliftError
from qlift.fsutil import AppendedLines
from qlift.rollout.planes import PLANES, SourceName

log = logging.getLogger(__name__)
ROLLOUT_LABELS = ["rollout", "stable", "canary", "state", "data_plane"]
SERIES = ("qlift_rollout_info", "qlift_rollout_canary_weight", "qlift_rollout_step", "qlift_rollout_interval_seconds",
          "qlift_rollout_windows_total", "qlift_rollout_canary_down", "qlift_nginx_responses_total",
          "qlift_nginx_upstream_responses_total")
BAKE_SERIES = ("qlift_rollout_bake_windows_left", "qlift_rollout_bake_windows_total")  # a rollout with --bake only


def status_class(status: int | None) -> str:
    """2xx/4xx/5xx, or ``error`` where nginx logged no status (the attempt got no answer)."""
    return f"{status // 100}xx" if status else "error"


class NginxLogCounts:
    """Counts of nginx's access log (qlift's JSON lines), read on from where the last read stopped."""

    def __init__(self) -> None:
        self.log: AppendedLines | None = None
        self.responses: Counter[tuple[str, str]] = Counter()
        self.upstream: Counter[tuple[str, str]] = Counter()

    def read(self, path: Path) -> None:
        if self.log is None or self.log.path != path:  # another rollout's prefix: its own counts
            self.log = AppendedLines(path)
            self.responses.clear()
            self.upstream.clear()
        for raw in self.log.read():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            self.responses[(str(line.get("pool", "")), status_class(_int(line.get("status"))))] += 1
            addrs = str(line.get("upstream_addr", "")).replace(" : ", ", ").split(",")
            statuses = str(line.get("upstream_status", "")).replace(" : ", ", ").split(",")
            for i, addr in enumerate(a.strip() for a in addrs):
                if addr:
                    self.upstream[(addr, status_class(_int(statuses[i]) if i < len(statuses) else None))] += 1


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


class RolloutCollector(Collector):
    """The journal's latest rollout, and nginx's counts when it runs on nginx, at each scrape."""

    def __init__(self, journal: Path) -> None:
        self.journal = journal
        self.nginx = NginxLogCounts()

    def collect(self) -> Iterator[Metric]:
        from qlift.rollout.journal import Journal

        try:
            with Journal(self.journal, readonly=True) as j:
                r = j.latest()
                history = j.history(r.id) if r is not None else {}
        except QliftError as exc:  # no journal yet (promote is creating it), or one being replaced
            log.debug("metrics: journal %s not readable: %s", self.journal, exc)
            return
        if r is None:
            return
        rid, spec = str(r.id), r.spec
        info = GaugeMetricFamily("qlift_rollout_info", "The journal's latest rollout (value 1).", labels=ROLLOUT_LABELS)
        info.add_metric([rid, r.stable, r.canary, r.state, str(spec.get("data_plane", ""))], 1)
        yield info
        changes = history.get("weight_changes") or []
        weight = GaugeMetricFamily("qlift_rollout_canary_weight", "Canary percent, as last journaled.",
                                   labels=["rollout"])
        weight.add_metric([rid], changes[-1]["weights"].get(r.canary, 0) if changes else 0)
        yield weight
        step = GaugeMetricFamily("qlift_rollout_step", "Index into the spec's steps.", labels=["rollout"])
        step.add_metric([rid], r.step)
        yield step
        interval = GaugeMetricFamily("qlift_rollout_interval_seconds", "The analysis window.",
                                     labels=["rollout", "canary"])
        interval.add_metric([rid, r.canary], float(spec.get("interval") or 0))
        yield interval
        windows = CounterMetricFamily("qlift_rollout_windows", "Analysis windows judged, by decision.",
                                      labels=["rollout", "canary", "action"])
        for action, n in sorted(Counter(str(w["action"]) for w in history.get("windows") or []).items()):
            windows.add_metric([rid, r.canary, action], n)
        yield windows
        yield _canary_down(rid, r.canary, history.get("windows") or [])
        if spec.get("bake"):
            yield from _bake(r, history.get("windows") or [])
        plane = PLANES.get(str(spec.get("data_plane", "")))
        if plane is not None and plane.section is not None and plane.evidence == SourceName.NGINX_ACCESS_LOG:
            prefix = (spec.get(plane.section) or {}).get("prefix")
            if prefix:
                yield from self._nginx(Path(prefix) / "logs" / "access.jsonl")

    def _nginx(self, path: Path) -> Iterator[Metric]:
        self.nginx.read(path)
        responses = CounterMetricFamily("qlift_nginx_responses", "nginx's answers by the version its split chose "
                                        "and status class (its own 502/504 included).", labels=["pool", "status_class"])
        for (pool, cls), n in sorted(self.nginx.responses.items()):
            responses.add_metric([pool, cls], n)
        yield responses
        upstream = CounterMetricFamily("qlift_nginx_upstream_responses", "Each attempt nginx made on a server "
                                       "(host:port), by status class; a replayed failure counts on its server.",
                                       labels=["upstream", "status_class"])
        for (addr, cls), n in sorted(self.nginx.upstream.items()):
            upstream.add_metric([addr, cls], n)
        yield upstream


def _bake(r: Any, windows: list[dict[str, Any]]) -> Iterator[Metric]:
    """The bake after 100%: windows still needed, and its windows by decision (they count in windows_total too)."""
    from qlift.rollout.analysis import BAKE_STEP
    from qlift.rollout.states import Phase, State

    rid, baked = str(r.id), [w for w in windows if w["step"] == BAKE_STEP]
    passed = sum(1 for w in baked if Phase(w["action"]) in (Phase.PASS, Phase.ADVANCE))
    needed = int(r.spec["bake"])
    left = GaugeMetricFamily("qlift_rollout_bake_windows_left", "Passing bake windows at 100% still needed (0 once "
                             "the bake passed or the rollout ended).", labels=["rollout", "canary"])
    left.add_metric([rid, r.canary], max(0, needed - passed) if not r.state.final and r.state != State.BAKED else 0)
    yield left
    counts = CounterMetricFamily("qlift_rollout_bake_windows", "Bake windows judged at 100%, by decision.",
                                 labels=["rollout", "canary", "action"])
    for action, n in sorted(Counter(str(w["action"]) for w in baked).items()):
        counts.add_metric([rid, r.canary, action], n)
    yield counts


def _canary_down(rid: str, canary: str, windows: list[dict[str, Any]]) -> Metric:
    from qlift.rollout.status import last_down

    why = last_down(windows)
    down = GaugeMetricFamily("qlift_rollout_canary_down", "1 while the router keeps the canary out of rotation "
                             "(as the last judged window found it; reason: the router's), else 0.",
                             labels=["rollout", "canary", "reason"])
    down.add_metric([rid, canary, why or ""], 0 if why is None else 1)
    return down


def serve_metrics(journal: Path, port: int, host: str = "127.0.0.1") -> Any:
    """Serve the series on ``http://host:port/metrics`` from a daemon thread (it ends with the process); the
    server, to ``shutdown()`` sooner."""
    registry = CollectorRegistry()
    registry.register(RolloutCollector(journal))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    log.info("rollout metrics at http://%s:%d/metrics", host, server.server_port)
    return server
