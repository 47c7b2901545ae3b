"""A fleet of qlift routers as one data plane, with real parts on 127.0.0.1: nginx (Debian's) in front of two
`qlift router` processes, each version a real vllm-router over two small backends, traffic from the OpenAI SDK.
A router killed mid-rollout holds it (named) while nginx retries its requests on the other, and once it is back
both routers end at the same weights; a killed replica of the canary costs nothing; a bad canary is rolled back on
answers read from both routers. Discovery reads a headless Service's EndpointSlices through the real kubernetes
client (tests/kube_fake.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from faults import RouterProcess, TinyBackend
from kube_fake import FakeKube
from test_rollout_answers import CANARIES, healthy

from qlift.errors import ExternalToolError
from qlift.rollout.dataplane import WeightsSplit, make_data_plane
from qlift.rollout.fleet import FleetDataPlane, discover_routers
from qlift.rollout.journal import Journal
from qlift.rollout.reconcile import Reconciler
from qlift.rollout.sources import make_collector
from qlift.rollout.spec import build_spec
from qlift.rollout.spec_sections import RouterDiscovery
from qlift.rollout.states import EventKind
from qlift.serve.pool import ROUTER_CHECKS
from qlift.vllm.process import free_port

NGINX = Path("/usr/sbin/nginx")
VLLM_ROUTER = Path(sys.executable).parent / "vllm-router"
TOKEN = "fleet-token"
SLICES = ("discovery.k8s.io", "v1", "endpointslices")


def _prompt(i: int) -> str:
    return f"Please refund my order A{i:04d}. It arrived broken."


def _router(tmp_path: Path, name: str, stable: str, canary: str, *, port: int = 0) -> RouterProcess:
    return RouterProcess("--backend", f"stable={stable}#m", "--backend", f"canary={canary}#m",
                         "--weight", "stable=100", "--weight", "canary=0", "--public-model", "chat",
                         "--port", str(port or free_port()), "--state-file", tmp_path / f"{name}.state.json",
                         log_path=tmp_path / f"{name}.log", token=TOKEN)


class FleetNginx:
    """nginx on 127.0.0.1 over ``upstreams``: a request a dead router could not answer goes to the next one."""

    def __init__(self, upstreams: list[str], workdir: Path) -> None:
        self.upstreams, self.dir, self.port = upstreams, workdir, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FleetNginx:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        temps = "\n".join(f"    {k}_temp_path {d}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        servers = "\n".join(f"        server {u.removeprefix('http://')} max_fails=0;" for u in self.upstreams)
        # non_idempotent: a chat POST that a SIGKILLed router took but never answered is sent to the other router
        (d / "nginx.conf").write_text(f"""
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log off;
{temps}
    upstream routers {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{self.port};
        location / {{
            proxy_pass http://routers;
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
            proxy_connect_timeout 2s;
        }}
    }}
}}
""")
        self.proc = subprocess.Popen([str(NGINX), "-p", str(d), "-c", str(d / "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_http(f"{self.url}/nonexistent", self.proc, ok=lambda code: code > 0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class VllmRouterPool:
    """A real vllm-router (PyPI vllm-router) over ``replicas``, as `qlift serve --replicas` runs it."""

    def __init__(self, replicas: list[str], log: Path) -> None:
        self.port, self.log = free_port(), log
        self.argv = [str(VLLM_ROUTER), "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls", *replicas,
                     "--policy", "round_robin", *ROUTER_CHECKS, "--worker-startup-timeout-secs", "30",
                     "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warning"]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> VllmRouterPool:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_http(f"{self.url}/health", self.proc, ok=lambda code: code == 200)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def _wait_http(url: str, proc: subprocess.Popen[Any], *, ok: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args[0]} exited ({proc.returncode})"
        try:
            if ok(httpx.get(url, timeout=1).status_code):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout_s}s")


class SdkTraffic:
    """Chat requests through the OpenAI SDK (no retries of its own) on ``threads`` threads until stopped."""

    def __init__(self, url: str, threads: int = 3) -> None:
        import openai

        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=20)
        self.ok, self.errors = 0, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(threads)]

    def _run(self, k: int) -> None:
        i = k * 100_000
        while not self._stop.is_set():
            i += 1
            try:
                self.client.chat.completions.create(model="chat", max_tokens=64,
                                                    messages=[{"role": "user", "content": _prompt(i)}])
                self.ok += 1
            except Exception as exc:  # every failure a client would see
                self.errors.append(repr(exc))

    def __enter__(self) -> SdkTraffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def _promote(tmp_path: Path, routers: list[RouterProcess], *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "qlift", "promote", "start", *[a for r in routers for a in ("--router", r.url)],
            "--stable", "stable", "--canary", "canary", "--journal", str(tmp_path / "j.sqlite"), "--json", *extra]
    err = open(tmp_path / "promote.log", "w")  # noqa: SIM115  (the process writes it until it exits)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                            env={**os.environ, "QLIFT_ROUTER_TOKEN": TOKEN})


def _weights(router: RouterProcess) -> dict[str, int]:
    return dict(router.admin().state().weights)


def _until(what: Any, timeout_s: float, why: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.1)


@pytest.fixture
def backends() -> Iterator[dict[str, list[TinyBackend]]]:
    with TinyBackend("m", answer=healthy) as s0, TinyBackend("m", answer=healthy) as s1, \
            TinyBackend("m", answer=healthy) as c0, TinyBackend("m", answer=healthy) as c1:
        yield {"stable": [s0, s1], "canary": [c0, c1]}


# -- the spec, discovery, the plane -----------------------------------------------------------------------------


def test_routers_in_the_spec_and_repeated_router_flags(run_cli: Any, tmp_path: Path) -> None:
    listed = build_spec({"stable": "s", "canary": "c", "routers": ["http://127.0.0.1:1/", "http://127.0.0.1:2"]}, {})
    assert listed.routers == ["http://127.0.0.1:1", "http://127.0.0.1:2"] and listed.router is None
    found = build_spec({"stable": "s", "canary": "c", "routers": {"discover": {"service": "llm-router-fleet",
                                                                               "namespace": "serving"}}}, {})
    assert found.routers is not None and not isinstance(found.routers, list)
    assert found.routers.discover.port == "http"
    both = build_spec({"stable": "s", "canary": "c", "router": "http://127.0.0.1:3", "routers": ["http://127.0.0.1:1"]},
                      {})
    assert make_data_plane(both, router_token=None).fleet.urls() == [  # type: ignore[attr-defined]
        "http://127.0.0.1:1", "http://127.0.0.1:3"]  # router: is one more member
    one = build_spec({"stable": "s", "canary": "c", "router": "http://127.0.0.1:1"}, {})
    assert one.routers is None and type(make_data_plane(one, router_token=None)).__name__ == "RouterDataPlane"
    for bad, words in [({"routers": ["http://a:1", "http://a:1"]}, "each router's URL once"),
                       ({"routers": ["a:1"]}, "not an http:// or https:// URL"),
                       ({"routers": ["http://a:1"], "data_plane": "nginx", "nginx": {"prefix": str(tmp_path)},
                         "backends": {"s": "http://x:1", "c": "http://y:1"}}, "the nginx data plane is not one")]:
        r = run_cli("promote", "start", "-f", _spec_file(tmp_path, {"stable": "s", "canary": "c", **bad}))
        assert r.exit_code == 2 and words in r.stderr, r.stderr
    down = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    r = run_cli("promote", "start", "--router", down[0], "--router", down[1], "--stable", "s", "--canary", "c",
                "--journal", tmp_path / "j.sqlite")
    assert r.exit_code == 8 and all(f"router {u} does not answer" in r.stderr for u in down), r.stderr
    r = run_cli("promote", "start", "--router", down[0], "--router", down[1], "--next", "v3=http://127.0.0.1:9#m")
    assert r.exit_code == 2 and "--next works through one router, not a fleet" in r.stderr, r.stderr


def _spec_file(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "rollout.yaml"
    path.write_text(json.dumps(data))
    return path


def _slice(name: str, pods: list[tuple[str, bool]], *, service: str = "llm-router-fleet") -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": "serving", "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True, "terminating": gone}}
                          for ip, gone in pods]}


def test_discovery_reads_the_headless_services_endpoint_slices_every_time(tmp_path: Path) -> None:
    with FakeKube({SLICES: {"type": "object"}}) as kube:
        kube.put(SLICES[0], SLICES[2], _slice("fleet-a", [("10.0.0.1", False), ("10.0.0.2", False)]))
        kube.put(SLICES[0], SLICES[2], _slice("fleet-b", [("10.0.0.3", True)]))  # terminating by design
        kube.put(SLICES[0], SLICES[2], _slice("other", [("10.0.0.9", False)], service="llm"))
        where = RouterDiscovery(service="llm-router-fleet", namespace="serving", kubeconfig=kube.kubeconfig(tmp_path))
        assert discover_routers(where) == ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]
        kube.put(SLICES[0], SLICES[2], _slice("fleet-a", [("10.0.0.1", False), ("10.0.0.4", False)]))  # replaced
        assert discover_routers(where) == ["http://10.0.0.1:8080", "http://10.0.0.4:8080"]
        asked = [unquote(p) for _, p, _ in kube.requests]
        assert any("labelSelector=kubernetes.io/service-name=llm-router-fleet" in p for p in asked), asked
        with pytest.raises(ExternalToolError, match="list no router on a port named 'admin'"):
            discover_routers(where.model_copy(update={"port": "admin"}))


def test_the_fleet_plane_writes_every_router_merges_their_records_and_names_one_down(
        tmp_path: Path, backends: dict[str, list[TinyBackend]]) -> None:
    stable, canary = backends["stable"][0].url, backends["canary"][0].url
    with _router(tmp_path, "a", stable, canary) as a, _router(tmp_path, "b", stable, canary) as b:
        spec = build_spec({"stable": "stable", "canary": "canary", "routers": [a.url, b.url]}, {})
        plane = make_data_plane(spec, router_token=TOKEN)
        assert isinstance(plane, FleetDataPlane)
        with Journal(tmp_path / "j.sqlite") as journal:
            rid = journal.create(spec.model_dump(mode="json"), "stable", "canary").id
            journal.change_weights(rid, {"stable": 60, "canary": 40}, "step 1", plane.set_weights)
            assert _weights(a) == _weights(b) == plane.weights() == {"stable": 60, "canary": 40}
            b.admin().set_weights({"stable": 100, "canary": 0})  # b missed a write
            with pytest.raises(WeightsSplit, match=f"{b.url} {{'stable': 100, 'canary': 0}}"):
                plane.weights()
            assert Reconciler(journal, rid, plane).reconcile() is True  # every router gets the journal's again
            drift = journal.last_event(rid, (EventKind.DRIFT,))
            assert drift is not None and drift["found"][b.url] == {"stable": 100, "canary": 0}
        assert _weights(b) == {"stable": 60, "canary": 40}

        collector = make_collector(spec, {}, router_token=TOKEN)
        collector.begin()
        _chats(a.url, 12)
        _chats(b.url, 8)
        ev = collector.collect()
        assert ev.stable.requests + ev.canary.requests == 20  # each router's records, from its own cursor

        shadow = plane.mirror(stable="stable", canary="canary")  # type: ignore[attr-defined]
        shadow.start("canary", 100, 4)
        assert a.admin().state().shadow is not None and b.admin().state().shadow is not None
        a.admin().set_weights({"stable": 100, "canary": 0})
        b.admin().set_weights({"stable": 100, "canary": 0})
        shadow.begin()
        _chats(a.url, 3)
        _chats(b.url, 3)
        _until(lambda: len(shadow.peek().pairs) >= 6, 20, "the shadow pairs of both routers")
        pairs = shadow.collect().pairs
        assert len({p.seq for p in pairs}) == len(pairs) == 6
        shadow.stop()
        assert a.admin().state().shadow is None and b.admin().state().shadow is None

        b.stop(signal.SIGKILL)
        with pytest.raises(ExternalToolError, match=f"router {b.url} does not answer"):
            plane.weights()
        with pytest.raises(ExternalToolError, match=f"reached {a.url} only: router {b.url} does not answer"):
            plane.set_weights({"stable": 0, "canary": 100})
        assert _weights(a) == {"stable": 0, "canary": 100}


def _chats(url: str, n: int) -> None:
    with httpx.Client(timeout=20) as client:
        for i in range(n):
            body = {"model": "chat", "max_tokens": 32, "messages": [{"role": "user", "content": _prompt(i)}]}
            assert client.post(f"{url}/v1/chat/completions", json=body).status_code == 200


# -- whole rollouts through nginx ------------------------------------------------------------------------------

needs_parts = pytest.mark.skipif(not NGINX.exists() or not VLLM_ROUTER.is_file(), reason="needs nginx "
                                 "(apt-get install nginx) and vllm-router (pip install 'qlift[pool]')")


@needs_parts
def test_a_killed_router_holds_the_rollout_and_a_killed_replica_costs_nothing(
        tmp_path: Path, backends: dict[str, list[TinyBackend]]) -> None:
    pools = {v: VllmRouterPool([b.url for b in backends[v]], tmp_path / f"{v}-pool.log") for v in backends}
    with pools["stable"] as stable, pools["canary"] as canary, \
            _router(tmp_path, "a", stable.url, canary.url) as a, _router(tmp_path, "b", stable.url, canary.url) as b, \
            FleetNginx([a.url, b.url], tmp_path / "nginx") as nginx, SdkTraffic(nginx.url) as traffic:
        promote = _promote(tmp_path, [a, b], "--steps", "40,100", "--interval", "2s", "--min-requests", "8")
        try:
            _until(lambda: _weights(a).get("canary") == 40, 30, "the first step's weights")
            b_port = b.url.rsplit(":", 1)[1]
            b.stop(signal.SIGKILL)
            killed_at = time.time()
            time.sleep(4.5)  # two windows' worth: none may be judged while b does not answer
            judged = [w for w in _windows(tmp_path) if w["ended_at"] > killed_at + 0.5]
            assert promote.poll() is None and judged == [], judged
            assert f"router {b.url} does not answer" in (tmp_path / "promote.log").read_text()
            assert _weights(a) == {"stable": 60, "canary": 40}

            backends["canary"][0].close()  # one replica of the canary dies: vllm-router routes around it
            b2 = _router(tmp_path, "b", stable.url, canary.url, port=int(b_port)).start()  # same port, same state
            try:
                out, _ = promote.communicate(timeout=60)
                assert promote.returncode == 0, (tmp_path / "promote.log").read_text()[-3000:]
                assert json.loads(out)["state"] == "promoted"
                assert _weights(a) == _weights(b2) == {"stable": 0, "canary": 100}
            finally:
                b2.stop()
        finally:
            if promote.poll() is None:
                promote.kill()
                promote.wait(10)
    assert traffic.errors == [] and traffic.ok > 100, (traffic.ok, traffic.errors[:3])


def _windows(tmp_path: Path) -> list[dict[str, Any]]:
    from qlift.rollout.api import status

    return [w for s in status(tmp_path / "j.sqlite")["steps"] for w in s["windows"]]


@needs_parts
def test_a_bad_canary_is_rolled_back_on_answers_read_from_both_routers(tmp_path: Path) -> None:
    with TinyBackend("m", answer=healthy) as stable, TinyBackend("m", answer=CANARIES["refusal"]) as canary, \
            _router(tmp_path, "a", stable.url, canary.url) as a, _router(tmp_path, "b", stable.url, canary.url) as b, \
            FleetNginx([a.url, b.url], tmp_path / "nginx") as nginx, SdkTraffic(nginx.url) as traffic:
        promote = _promote(tmp_path, [a, b], "--steps", "50,100", "--interval", "3s", "--min-requests", "10")
        out, _ = promote.communicate(timeout=60)
        served = [sum(1 for r in x.admin().requests().requests if r.backend == "canary") for x in (a, b)]
        held = [_weights(a), _weights(b)]
    assert promote.returncode == 10, (tmp_path / "promote.log").read_text()[-3000:]
    st = json.loads(out)
    assert st["state"] == "rolled_back"
    failed = {c["name"] for w in st["steps"][0]["windows"] for c in w["checks"] if c["status"] == "fail"}
    assert "refusal" in failed, st["steps"][0]["windows"]
    assert min(served) > 0  # both routers served the canary, and both logs fed the judged window
    assert held == [{"stable": 100, "canary": 0}] * 2
    assert traffic.errors == [], traffic.errors[:3]
