"""Shadow traffic through qlift router: a share of the requests other versions serve is copied to the
shadow version; users see only the primary's answer; pairs for the judge; copies capped and dropped first."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from faults import FaultProxy, RouterProcess, run_load
from router_backends import ScriptedBackend

from qlift.errors import BadInputError

TOKEN = "admin-secret"


def _router(tmp_path: Path, stable: str, canary: str, name: str = "router") -> RouterProcess:
    return RouterProcess("--backend", f"stable={stable}", "--backend", f"canary={canary}", "--public-model", "pub",
                         "--weight", "stable=100", "--weight", "canary=0", log_path=tmp_path / f"{name}.log",
                         token=TOKEN)


def _wait(cond, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_shadow_copies_a_share_and_pairs_both_answers(tmp_path: Path) -> None:
    with ScriptedBackend("m-stable", tokens=3) as stable, ScriptedBackend("m-canary", tokens=5) as canary, \
            _router(tmp_path, stable.url, canary.url) as router:
        admin = router.admin()
        assert admin.state().shadow is None
        state = admin.set_shadow("canary", 20, max_inflight=4)
        assert state.shadow is not None and (state.shadow.percent, state.shadow.sent) == (20, 0)
        res = run_load(router.url, "pub", requests=25, concurrency=1, stream=False, timeout_s=60)
        res2 = run_load(router.url, "pub", requests=25, concurrency=1, stream=True, timeout_s=60)
        assert res.errors == res2.errors == 0
        assert res.backends == {"stable": 25} and res2.backends == {"stable": 25}  # users see stable only
        _wait(lambda: admin.shadow_pairs().next == 10)
        shadow = admin.state().shadow
        assert shadow is not None and (shadow.sent, shadow.dropped) == (10, 0)
        assert len(canary.bodies) == 10 and {b["model"] for b in canary.bodies} == {"m-canary"}
        batch = admin.shadow_pairs()
        assert [p.seq for p in batch.pairs] == list(range(1, 11))
        for pair in batch.pairs:
            assert pair.path == "/v1/chat/completions" and pair.request["model"] == "pub"
            assert pair.request["messages"][0]["content"].startswith("Count to ten.")
            assert "stream_options" not in pair.request or pair.request["stream_options"] == {"include_usage": True}
            p, s = pair.primary, pair.shadow
            assert (p.backend, s.backend) == ("stable", "canary") and p.ok and s.ok and s.reason is None
            assert (p.text, s.text) == ("hi " * 3, "hi " * 5)
            assert (p.completion_tokens, s.completion_tokens) == (3, 5) and s.finish_reason == "length"
            assert s.ttft_s is not None and s.ttft_s <= s.latency_s
        assert {p.request.get("stream", False) for p in batch.pairs} == {False, True}
        assert admin.shadow_pairs(since=8).pairs[0].seq == 9 and admin.shadow_pairs(since=10).pairs == []
        # The copies are not user traffic: the judge's request records hold stable's 50 only.
        assert {r.backend for r in admin.requests().requests} == {"stable"} and admin.state().seq == 50
        assert router.metric("qlift_router_shadow_total", backend="canary", outcome="ok") == 10
        admin.clear_shadow()
        assert admin.state().shadow is None and len(admin.shadow_pairs().pairs) == 10  # pairs stay readable
        run_load(router.url, "pub", requests=10, concurrency=1, stream=False, timeout_s=60)
        assert len(canary.bodies) == 10
        with pytest.raises(BadInputError, match="not a backend"):
            admin.set_shadow("blue", 20)
        with pytest.raises(BadInputError, match="percent"):
            admin.set_shadow("canary", 0)
        r = httpx.get(router.url + "/admin/shadow", params={"since": "1e26"},
                      headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 400
        assert httpx.get(router.url + "/admin/shadow").status_code == 401


def test_a_failing_shadow_is_paired_and_never_reaches_users(tmp_path: Path) -> None:
    with ScriptedBackend("m-stable") as stable, ScriptedBackend("m-canary", mode="not_json") as canary, \
            _router(tmp_path, stable.url, canary.url) as router:
        router.admin().set_shadow("canary", 100)
        res = run_load(router.url, "pub", requests=6, concurrency=2, stream=False, timeout_s=60)
        assert res.errors == 0 and res.backends == {"stable": 6}
        _wait(lambda: router.admin().shadow_pairs().next == 6)
        pairs = router.admin().shadow_pairs().pairs
        assert all(p.primary.ok and not p.shadow.ok and p.shadow.reason == "bad_body" for p in pairs)
        assert router.metric("qlift_router_shadow_total", backend="canary", outcome="failed") == 6


def test_a_copy_that_finds_the_cap_full_waits_for_a_slot_and_is_paired(tmp_path: Path) -> None:
    """Two requests arrive at once, and the cap is 1: the second copy waits for the first (the canary is fast enough
    to answer both before the next two arrive) instead of being dropped, and every request is paired. Before,
    light traffic lost copies whenever one ended a moment after its primary."""
    with ScriptedBackend("m-stable", tokens=4, chunk_delay_s=0.05) as stable, \
            ScriptedBackend("m-canary", tokens=4, chunk_delay_s=0.02) as canary, \
            _router(tmp_path, stable.url, canary.url) as router:
        router.admin().set_shadow("canary", 100, max_inflight=1)
        res = run_load(router.url, "pub", requests=8, concurrency=2, stream=True, timeout_s=60)
        assert res.errors == 0 and res.backends == {"stable": 8}
        _wait(lambda: router.admin().shadow_pairs().next == 8)
        shadow = router.admin().state().shadow
        assert shadow is not None and (shadow.sent, shadow.dropped, shadow.waiting) == (8, 0, 0)
        assert len(canary.bodies) == 8


def test_copies_are_capped_dropped_first_and_never_delay_the_primary(tmp_path: Path) -> None:
    with ScriptedBackend("m-stable") as stable, ScriptedBackend("m-canary") as canary, \
            FaultProxy(canary.url, stall=True) as stalled, _router(tmp_path, stable.url, stalled.url) as router:
        router.admin().set_shadow("canary", 100, max_inflight=2)
        t0 = time.monotonic()
        res = run_load(router.url, "pub", requests=20, concurrency=4, stream=True, timeout_s=60)
        took = time.monotonic() - t0
        assert res.errors == 0 and res.backends == {"stable": 20}
        assert took < 10, took  # the stalled copies held nobody
        shadow = router.admin().state().shadow
        # two in flight, two queued behind them (for COPY_WAIT_S at most), the other 16 dropped at once
        assert shadow is not None and (shadow.sent, shadow.inflight, shadow.waiting, shadow.dropped) == (2, 2, 2, 16)
        assert router.metric("qlift_router_shadow_total", backend="canary", outcome="dropped") == 16
        assert router.admin().shadow_pairs().pairs == []  # the two copies are still waiting
