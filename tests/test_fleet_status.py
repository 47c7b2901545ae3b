"""A fleet of qlift routers (``routers:`` alone, no ``router:``) in the two places that read only one router before:
`promote status`'s live weights (one line per router, each router's weights or why it did not answer, listed or
discovered through EndpointSlices) and the window-sizing check before the first window (the SUM of every router's
recent rate: each sees only its share of the clients). Real `qlift router` processes on 127.0.0.1 over small
backends; discovery through the real kubernetes client against tests/kube_fake.py."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults import RouterProcess, TinyBackend
from kube_fake import FakeKube
from test_promote_fleet import SLICES, TOKEN, _chats, _router
from test_rollout_answers import healthy

from qlift.errors import BadInputError
from qlift.rollout.journal import Journal
from qlift.rollout.preflight import check_window_sizing, recent_rate
from qlift.rollout.spec import build_spec
from qlift.vllm.process import free_port

HELD = {"stable": 60, "canary": 40}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RouterProcess, RouterProcess]]:
    tmp = tmp_path_factory.mktemp("fleet")
    with TinyBackend("m", answer=healthy) as stable, TinyBackend("m", answer=healthy) as canary, \
            _router(tmp, "a", stable.url, canary.url) as a, _router(tmp, "b", stable.url, canary.url) as b:
        yield a, b


def _status(run_cli: Any, tmp_path: Path, routers: Any, **more: Any) -> tuple[dict[str, Any], list[str]]:
    """`promote status` (--json, then text) of a rollout of ``routers`` no controller runs."""
    journal = tmp_path / f"j{time.monotonic_ns()}.sqlite"
    spec = build_spec({"stable": "stable", "canary": "canary", "routers": routers, **more}, {})
    with Journal(journal) as j:
        j.create(spec.model_dump(mode="json"), "stable", "canary")
    shown = run_cli("promote", "status", "--journal", journal, "--json")
    assert shown.exit_code == 0, shown.stderr
    text = run_cli("promote", "status", "--journal", journal)
    assert text.exit_code == 0, text.stderr
    live = json.loads(shown.stdout)["live"]
    page = tmp_path / f"{journal.stem}.html"  # the rollout's page names each router as the text does
    assert run_cli("promote", "report", "-o", page, "--journal", journal).exit_code == 0
    html = page.read_text(encoding="utf-8")
    for url in live.get("routers") or {}:
        assert f'<li class="live">router {url} now ' in html, html
    return live, [ln for ln in text.stdout.splitlines() if "router" in ln]


def test_status_shows_every_listed_routers_weights(run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    fleet: tuple[RouterProcess, RouterProcess]) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)
    a, b = fleet
    a.admin().set_weights(HELD)
    b.admin().set_weights(HELD)
    live, lines = _status(run_cli, tmp_path, [a.url, b.url])
    assert live == {"url": f"{a.url}, {b.url}", "weights": HELD, "error": None,
                    "routers": {a.url: {"weights": HELD, "error": None}, b.url: {"weights": HELD, "error": None}}}
    for r in (a, b):
        assert sum(f"router {r.url} now holds stable 60% / canary 40%" in ln for ln in lines) == 1, lines

    # one router disagrees, one does not answer: each named on its own line
    b.admin().set_weights({"stable": 100, "canary": 0})
    dead = f"http://127.0.0.1:{free_port()}"
    live, lines = _status(run_cli, tmp_path, [a.url, b.url, dead])
    assert live["weights"] is None and live["error"].startswith(f"router {dead} does not answer"), live
    assert live["routers"][b.url] == {"weights": {"stable": 100, "canary": 0}, "error": None}
    assert live["routers"][dead]["weights"] is None and live["routers"][dead]["error"]
    assert any(f"router {b.url} now holds stable 100% / canary 0%" in ln for ln in lines), lines
    assert any(f"router {dead} now does not answer: " in ln for ln in lines), lines
    live, _ = _status(run_cli, tmp_path, [a.url, b.url])
    assert live["weights"] is None and live["error"] == "the routers hold different weights", live

    # one router: the form it always had, no routers key
    journal = tmp_path / "one.sqlite"
    with Journal(journal) as j:
        j.create(build_spec({"stable": "stable", "canary": "canary", "router": a.url}, {}).model_dump(mode="json"),
                 "stable", "canary")
    one = json.loads(run_cli("promote", "status", "--journal", journal, "--json").stdout)["live"]
    assert one == {"url": a.url, "weights": HELD, "error": None}


def _slice(name: str, url: str) -> dict[str, Any]:
    port = int(url.rsplit(":", 1)[1])
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": "serving", "labels": {"kubernetes.io/service-name": "fleet"}},
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]}


def test_status_shows_every_discovered_routers_weights(run_cli: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       fleet: tuple[RouterProcess, RouterProcess]) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)
    a, b = fleet
    a.admin().set_weights(HELD)
    b.admin().set_weights(HELD)
    with FakeKube({SLICES: {"type": "object"}}) as kube:
        kube.put(SLICES[0], SLICES[2], _slice("fleet-a", a.url))
        kube.put(SLICES[0], SLICES[2], _slice("fleet-b", b.url))
        where = {"discover": {"service": "fleet", "namespace": "serving", "kubeconfig": str(kube.kubeconfig(tmp_path))}}
        live, lines = _status(run_cli, tmp_path, where)
        assert live["weights"] == HELD and set(live["routers"]) == {a.url, b.url}, live
        assert sorted(ln for ln in lines if " now holds stable 60% / canary 40%" in ln) == sorted([  # slices' order
            f"router {a.url} now holds stable 60% / canary 40%", f"router {b.url} now holds stable 60% / canary 40%"])

        gone = {"discover": {**where["discover"], "service": "no-such-service"}}
        live, lines = _status(run_cli, tmp_path, gone)
        assert live["routers"] == {} and live["weights"] is None and "list no router" in live["error"], live
        assert any(ln.startswith("the routers of Service serving/no-such-service could not be listed: ")
                   for ln in lines), lines


def test_window_sizing_sums_the_fleets_traffic(caplog: pytest.LogCaptureFixture,
                                              fleet: tuple[RouterProcess, RouterProcess]) -> None:
    a, b = fleet
    small = {"stable": "stable", "canary": "canary", "steps": [10, 100], "interval": 1,
             "analysis": {"min_requests": 20}}
    for r in (a, b):
        r.admin().set_weights({"stable": 100, "canary": 0})
    fresh = build_spec({**small, "routers": [a.url, b.url]}, {})
    with caplog.at_level(logging.WARNING, logger="qlift.rollout.preflight"):  # no traffic yet: one warning
        check_window_sizing(fresh, TOKEN)
    assert any("have too little traffic yet to size the windows by" in m for m in caplog.messages), caplog.text
    caplog.clear()

    for _ in range(6):  # each router its share: about 1.5 requests/s each, 3/s for the fleet
        _chats(a.url, 1)
        _chats(b.url, 1)
        time.sleep(0.6)
    with pytest.raises(BadInputError) as refused:
        check_window_sizing(fresh, TOKEN)
    rates = [recent_rate(r.url, TOKEN) for r in (a, b)]
    each = [r[0] for r in rates if r is not None]
    assert len(each) == 2, rates
    line = refused.value.one_line()
    assert "the windows cannot reach their minimum at the traffic of 2 routers summed (" in line, line
    found = re.search(r"step 1 \(canary 10%\): 10% x ([\d.]+) req/s", line)
    assert found is not None, line
    fleet_rps = float(found.group(1))
    assert fleet_rps > 1.5 * max(each) and abs(fleet_rps - sum(each)) <= 0.2 * sum(each), (fleet_rps, each)

    # a router whose log cannot be read is named, never a crash; the rest's sum is a lower bound: a warning
    dead = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="qlift.rollout.preflight"):
        check_window_sizing(build_spec({**small, "routers": [a.url, b.url, dead]}, {}), TOKEN)
    assert any(f"router {dead} does not answer" in m and "1 of 3 routers could not be read" in m
               for m in caplog.messages), caplog.text
    assert any("the windows cannot reach their minimum at the traffic of 2 routers summed" in m and "a lower bound"
               in m for m in caplog.messages), caplog.text
