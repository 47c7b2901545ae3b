"""nginx as the data plane: qlift renders the whole config into its own prefix dir.

Layout under ``prefix`` (nginx runs as a plain process: ``nginx -p PREFIX -c PREFIX/nginx.conf``)::

    nginx.conf          rendered by qlift (first line records the weights)
    nginx.pid           the master's pid
    logs/error.log      nginx's own log
    logs/access.jsonl   one JSON line per request: the rollout's evidence (see AccessLogSource)
    logs/reloads.jsonl  one JSON line per reload: when, and how long old workers keep answers
    tmp/                client body / proxy temp dirs

The split: ``split_clients`` over the session key (``X-Session-Id`` by default) so one
conversation stays on one version, or over ``$request_id`` when there is no key. Each
version's upstream lists the other version as ``backup``, with ``proxy_next_upstream`` on
errors and 5xx, so a failing canary's request is replayed once on the stable (the qlift
router's failover, in nginx terms). ``proxy_buffering off`` keeps streams unbuffered.
A change is written to a temp file, checked with ``nginx -t``, moved into place, and
applied with ``nginx -s reload``.

A reload must not drop an answer. Old workers finish their in-flight streams for up to
``max_answer_s`` (``worker_shutdown_timeout``; the same bound as ``proxy_read_timeout``),
and client connections are not kept alive between requests: an old worker closes its idle
kept-alive connections at a reload, and a client that sends its next request on one just
then gets no answer at all (measured: 40 of 88 streamed requests lost over six reloads under
eight aiohttp clients), a failure nginx never logs. A new connection per request costs a
loopback handshake beside seconds of generation. An answer an old worker still cuts (one
longer than ``max_answer_s``) counts as an error of its version in the evidence: each reload is
noted in ``logs/reloads.jsonl``, and a line logged with ``request_completion`` empty, in flight at
a reload and ended when that reload's old worker gave up, is such an answer. Other incomplete
answers are clients that went away mid-stream (nginx logs them the same way): nobody's error.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from qlift.errors import BadInputError, ExternalToolError
from qlift.fsutil import AppendedLines
from qlift.rollout.dataplane import DataPlane, ServerAddress
from qlift.rollout.evidence import EvidenceCounter, Observation, VersionEvidence
from qlift.rollout.planes import PLANES, Capability, SourceName
from qlift.rollout.spec import NginxSpec, RolloutSpec

_WEIGHTS_MARK = "# qlift-weights: "
RELOADS = "reloads.jsonl"
CUT_SLACK_S = 5.0  # between an old worker giving up and its log line

_LOG_FORMAT = (
    "'{\"time\":$msec,\"status\":$status,\"pool\":\"$qlift_pool\",\"request_time\":$request_time,"
    "\"upstream_addr\":\"$upstream_addr\",\"upstream_status\":\"$upstream_status\","
    "\"upstream_response_time\":\"$upstream_response_time\",\"upstream_header_time\":\"$upstream_header_time\","
    "\"content_type\":\"$upstream_http_content_type\",\"completion\":\"$request_completion\"}'"
)


def upstream_name(version: str) -> str:
    return "qlift_" + re.sub(r"[^A-Za-z0-9_]", "_", version)


def host_port(url: str) -> str:
    parts = urlsplit(url if "//" in url else f"http://{url}")
    if parts.fragment:
        # nginx picks an upstream per server; it cannot route on the model name inside the request body.
        raise BadInputError(f"backend '{url}' names a model on a shared server (#{parts.fragment}); the nginx data "
                            "plane splits traffic by server only", field="backends",
                            hint="Use the qlift router (--data-plane builtin) for versions that share one server.")
    if not parts.hostname or not parts.port:
        raise BadInputError(f"backend URL '{url}' needs a host and a port", field="backends")
    return f"{parts.hostname}:{parts.port}"


def seconds(value: float) -> str:
    return f"{max(1, math.ceil(value))}s"


def render_nginx_conf(spec: NginxSpec, backends: dict[str, str], weights: dict[str, int]) -> str:
    """The complete nginx.conf for ``weights`` over ``backends`` (version -> URL)."""
    prefix = Path(spec.prefix).resolve()
    versions = list(backends)
    upstreams = []
    # Idle kept-alive connections are dropped before vLLM's own 5 s keep-alive closes them: a
    # request sent on a connection the backend just closed would fail over to the other version.
    for v in versions:
        others = [o for o in versions if o != v]
        lines = [f"        server {host_port(backends[v])} max_fails=0;"]
        lines += [f"        server {host_port(backends[o])} max_fails=0 backup;" for o in others]
        lines += ["        keepalive 32;", "        keepalive_timeout 4s;"]
        upstreams.append(f"    upstream {upstream_name(v)} {{\n" + "\n".join(lines) + "\n    }")
    # Heaviest version takes the remainder (*): split_clients wants percentages below 100.
    ordered = sorted(versions, key=lambda v: weights.get(v, 0))
    rest = ordered[-1]
    split = [f"        {weights[v]}% {upstream_name(v)};" for v in ordered[:-1] if weights.get(v, 0) > 0]
    split.append(f"        * {upstream_name(rest)};")
    temp = "\n".join(f"    {kind}_temp_path {prefix}/tmp/{kind};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    backend_header = ("\n            add_header X-Qlift-Backend $upstream_addr always;"
                      if spec.expose_backend_header else "")
    return f"""{_WEIGHTS_MARK}{json.dumps(weights, sort_keys=True)}
# Rendered by qlift promote; edits are overwritten on the next weight change.
worker_processes 1;
worker_shutdown_timeout {seconds(spec.max_answer_s)};
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{
    worker_connections 1024;
}}
http {{
{temp}
    log_format qlift_json escape=json {_LOG_FORMAT};
    access_log {prefix}/logs/access.jsonl qlift_json;
    keepalive_timeout {seconds(spec.client_keepalive_s) if spec.client_keepalive_s else 0};
{chr(10).join(upstreams)}
    map {spec.session_key} $qlift_split_key {{
        "" $request_id;
        default {spec.session_key};
    }}
    split_clients "$qlift_split_key" $qlift_pool {{
{chr(10).join(split)}
    }}
    server {{
        listen {spec.listen};
        location / {{
            proxy_pass http://$qlift_pool;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout {seconds(spec.max_answer_s)};
            proxy_next_upstream error timeout http_500 http_502 http_503 http_504 non_idempotent;
            proxy_next_upstream_tries 2;{backend_header}
        }}
    }}
}}
"""


def split_weights(conf_text: str, versions: list[str]) -> dict[str, int] | None:
    """Weights per version read from the ``split_clients ... $qlift_pool`` block; None if it is not there."""
    block = re.search(r"split_clients\s+\S+\s+\$qlift_pool\s*\{([^}]*)\}", conf_text)
    if block is None:
        return None
    by_upstream = {upstream_name(v): v for v in versions}
    weights = dict.fromkeys(versions, 0)
    rest: str | None = None
    for entry in block.group(1).split(";"):
        parts = entry.split()
        if len(parts) != 2 or parts[1] not in by_upstream:
            continue
        if parts[0] == "*":
            rest = by_upstream[parts[1]]
        elif parts[0].endswith("%"):
            try:
                weights[by_upstream[parts[1]]] += round(float(parts[0][:-1]))
            except ValueError:
                return None
    if rest is not None:
        weights[rest] += max(0, 100 - sum(weights.values()))
    return weights


class NginxDataPlane:
    kind = "nginx"
    capabilities: ClassVar[frozenset[Capability]] = PLANES["nginx"].capabilities

    def __init__(self, spec: NginxSpec, backends: dict[str, str]) -> None:
        for url in backends.values():
            host_port(url)  # refused here, before a rollout is journaled
        self.spec = spec
        self.backends = backends
        self.prefix = Path(spec.prefix).resolve()
        self.conf = self.prefix / "nginx.conf"

    def _nginx(self, *args: str, conf: Path | None = None) -> subprocess.CompletedProcess[str]:
        argv = [self.spec.binary, "-p", str(self.prefix), "-c", str(conf or self.conf), *args]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except FileNotFoundError:
            raise ExternalToolError(f"nginx executable '{self.spec.binary}' not found",
                                    hint="Install nginx (Debian: apt-get install nginx) or set nginx.binary.",
                                    tool="nginx") from None

    def weights(self) -> dict[str, int] | None:
        """The split nginx.conf's ``split_clients`` block sets, so a hand edit of it reads as drift."""
        try:
            text = self.conf.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        return split_weights(text, list(self.backends))


    def running_pid(self) -> int | None:
        try:
            pid = int((self.prefix / "nginx.pid").read_text().strip())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def check(self, conf: Path) -> None:
        result = self._nginx("-t", "-q", conf=conf)
        if result.returncode != 0:
            raise ExternalToolError(f"nginx -t rejected the rendered config: {result.stderr.strip()[:400]}",
                                    tool="nginx")

    def set_weights(self, weights: dict[str, int]) -> None:
        for sub in ("logs", "tmp"):
            (self.prefix / sub).mkdir(parents=True, exist_ok=True)
        tmp = self.conf.with_name(f".nginx.conf.{os.getpid()}.tmp")
        tmp.write_text(render_nginx_conf(self.spec, self.backends, weights), encoding="utf-8")
        try:
            self.check(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, self.conf)
        reload = self.running_pid() is not None
        at = time.time()
        result = self._nginx("-s", "reload") if reload else self._nginx()
        if result.returncode != 0:
            raise ExternalToolError(f"nginx did not take the new config: {result.stderr.strip()[:400]}", tool="nginx")
        if reload:
            with open(self.prefix / "logs" / RELOADS, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"time": at, "max_answer_s": self.spec.max_answer_s, "weights": weights}) + "\n")

    def stop(self) -> None:
        if self.running_pid():
            self._nginx("-s", "stop")

    def backend_urls(self) -> dict[str, str]:
        return dict(self.backends)

    def server(self, version: str) -> ServerAddress | None:
        """Its --backend URL; a ``#MODEL`` after it names the model the server must list."""
        url = self.backends.get(version)
        return ServerAddress(url, url.partition("#")[2] or None) if url else None


def make_nginx_plane(spec: RolloutSpec, *, router_token: str | None) -> DataPlane:
    assert spec.nginx is not None
    return NginxDataPlane(spec.nginx, {v: spec.backends[v] for v in (spec.stable, spec.canary)})


class AccessLogSource:
    """Evidence from nginx's JSON access log: one attempt per upstream address in each line.

    A line like ``upstream_addr "A, B"`` / ``upstream_status "500, 200"`` is a failed
    attempt on A replayed on B: the failure counts against A. Status 499 (the client went
    away) counts for nobody. nginx knows no tokens or finish reasons: those come from vLLM's
    /metrics of each backend.
    """

    name: str = SourceName.NGINX_ACCESS_LOG

    def __init__(self, prefix: Path, backends: dict[str, str]) -> None:
        self.path = Path(prefix).resolve() / "logs" / "access.jsonl"
        self.reloads_path = self.path.with_name(RELOADS)
        self.reloads: list[tuple[float, float]] = []  # (when, how long old workers keep answers)
        self.by_addr = {host_port(url): v for v, url in backends.items()}
        self.versions = list(backends)
        self.log = AppendedLines(self.path)  # a rotated (truncated or replaced) log is read from its start
        self.lines: list[dict[str, object]] = []

    def begin(self) -> None:
        self.log.skip_existing()
        self.lines = []

    def _poll(self) -> None:
        self.reloads = _read_reloads(self.reloads_path)
        for raw in self.log.read():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if int(line.get("status", 0)) != 499:
                self.lines.append(line)

    def _folded(self) -> dict[str, VersionEvidence]:
        counters = {v: EvidenceCounter(v, bodies=False) for v in self.versions}
        for line in self.lines:
            for version, o in self._observations(line):
                counters[version].add(o)
        return {v: c.evidence() for v, c in counters.items()}

    def peek(self) -> dict[str, VersionEvidence]:
        self._poll()
        return self._folded()

    def collect(self) -> dict[str, VersionEvidence]:
        self._poll()
        out = self._folded()
        self.lines = []
        return out

    def _observations(self, line: dict[str, object]) -> Iterator[tuple[str, Observation]]:
        """One log line's attempts (one per upstream nginx tried), as the evidence counter takes them."""
        addrs = [a.strip() for a in str(line.get("upstream_addr", "")).replace(" : ", ", ").split(",")]
        statuses = str(line.get("upstream_status", "")).replace(" : ", ", ").split(",")
        totals = str(line.get("upstream_response_time", "")).replace(" : ", ", ").split(",")
        headers = str(line.get("upstream_header_time", "")).replace(" : ", ", ").split(",")
        for i, addr in enumerate(addrs):
            version = self.by_addr.get(addr)
            if version is None:
                continue
            status = _num(statuses, i)
            last = i == len(addrs) - 1
            incomplete = last and "completion" in line and line.get("completion") != "OK" and _final_status(line) < 400
            if incomplete and not self._cut_by_reload(line):
                continue  # the client went away mid-stream: nobody's error, no latency
            ok = not (status is None or status >= 500 or incomplete)
            # time to the first byte is TTFT only for a stream (the counter's rule)
            stream = str(line.get("content_type", "")).startswith("text/event-stream")
            yield version, Observation(ok, _num(totals, i), stream, _num(headers, i))


    def _cut_by_reload(self, line: dict[str, object]) -> bool:
        """In flight at a reload and ended when that reload's old worker gave up on it."""
        end = _float(line.get("time"))
        start = end - _float(line.get("request_time"))
        return any(start <= at and at + keep - 1.0 <= end <= at + keep + CUT_SLACK_S for at, keep in self.reloads)


def _read_reloads(path: Path) -> list[tuple[float, float]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for raw in lines:
        try:
            r = json.loads(raw)
            out.append((float(r["time"]), float(r["max_answer_s"])))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _float(value: object) -> float:
    try:
        return float(str(value))
    except ValueError:
        return 0.0


def _final_status(line: dict[str, object]) -> int:
    try:
        return int(str(line.get("status", 0)))
    except ValueError:
        return 0


def _num(values: list[str], i: int) -> float | None:
    try:
        return float(values[i].strip())
    except (IndexError, ValueError):
        return None
