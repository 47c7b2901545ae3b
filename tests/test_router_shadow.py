"""Shadow traffic through qlift router: a share of the requests other versions serve is copied to the
shadow version; users see only the primary's answer; pairs for the judge; copies capped and dropped first."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from faults import FaultProxy, RouterProcess, run_load
from router_backends import ScriptedBackend

from qlift.errors import BadInputError
from qlift.router.wire import ShadowAnswer

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


def _side(text: str) -> ShadowAnswer:
    return ShadowAnswer(backend="b", status=200, ok=True, latency_s=0.0, text=text)


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS:")).split()[1])


def test_shadow_pairs_keep_what_the_judge_reads_not_the_clients_bodies(tmp_path: Path) -> None:
    """Issue 29: twelve 1 MB chat bodies at shadow 100% added 98 MiB to the router (the ring kept whole
    bodies, 2,000 of them). A pair keeps role + text up to PROMPT_CHARS, a small response_format,
    stream, max_tokens; the judge's keys keep their shapes."""
    from qlift.router.pairs import PROMPT_CHARS, RESPONSE_FORMAT_BYTES, Pair, PairRing, judge_view

    with ScriptedBackend("m-stable") as stable, ScriptedBackend("m-canary") as canary, \
            _router(tmp_path, stable.url, canary.url) as router:
        assert router.proc is not None
        router.admin().set_shadow("canary", 100, max_inflight=4)
        small = {"model": "pub", "max_tokens": 4, "messages": [{"role": "user", "content": "warm up"}]}
        for _ in range(3):
            assert httpx.post(router.url + "/v1/chat/completions", json=small, timeout=30).status_code == 200
        _wait(lambda: router.admin().shadow_pairs().next == 3)
        before = _rss_kib(router.proc.pid)
        n = 24
        for i in range(n):
            body = {"model": "pub", "max_tokens": 4, "stream": i % 2 == 0, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "schema": {"description": "d" * 20_000}}},
                "messages": [{"role": "system", "content": "s" * 500_000},
                             {"role": "user", "content": [{"type": "text", "text": f"q{i} JSON " + "x" * 490_000}]}]}
            r = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
        _wait(lambda: router.admin().shadow_pairs().next == 3 + n, timeout=60)
        grown_mib = (_rss_kib(router.proc.pid) - before) / 1024
        pairs = router.admin().shadow_pairs(since=3).pairs
        assert len(pairs) == n
        for i, pair in enumerate(pairs):
            req = pair.request
            assert len(json.dumps(req)) < PROMPT_CHARS + 1000, len(json.dumps(req))
            assert req["stream"] == (i % 2 == 0) and req["max_tokens"] == 4 and req["truncated"] is True
            assert [m["role"] for m in req["messages"]] == ["user"]  # the question asked is kept first
            assert req["messages"][0]["content"].startswith(f"q{i} JSON ")
            assert req["response_format"] == {"type": "json_schema"} and req["response_format_dropped"] is True
        assert grown_mib < 40, grown_mib  # whole bodies: ~8 MiB a pair
    # The ring is bounded in bytes too: the oldest pairs go first.
    ring = PairRing(max_bytes=200_000)
    for i in range(100):
        ring.finish(Pair(f"r{i}", 0.0, "/v1/completions", judge_view({"prompt": "p" * 50_000, "stream": False}),
                         primary=_side("a"), shadow=_side("b")))
    kept = [p["seq"] for p in ring.since(0)["pairs"]]  # ~8 KB a pair (its prompt capped): the last 24
    assert ring.bytes <= 200_000 and 20 <= len(kept) < 30 and kept == list(range(101 - len(kept), 101))
    assert judge_view({"response_format": {"type": "json_object"}, "prompt": "hi"}) == {
        "response_format": {"type": "json_object"}, "prompt": "hi", "truncated": False}
    assert len(json.dumps(judge_view({"response_format": {"x": "y" * RESPONSE_FORMAT_BYTES}}))) < 200


def test_a_partner_copies_either_versions_requests_to_the_other_and_nothing_else() -> None:
    from qlift.router.wire import ShadowSettings

    known = ["stable", "canary", "other"]
    s = ShadowSettings.parse({"version": "canary", "percent": 10, "partner": "stable"}, known)
    assert [s.target_for(n) for n in known] == ["canary", "stable", None]
    assert ShadowSettings.parse(s.as_dict(), known) == s  # saved and restored as it was set
    plain = ShadowSettings.parse({"version": "canary", "percent": 10}, known)
    assert [plain.target_for(n) for n in known] == ["canary", None, "canary"] and "partner" not in plain.as_dict()
    for bad in ("canary", "nobody", 3):
        with pytest.raises(ValueError, match="partner"):
            ShadowSettings.parse({"version": "canary", "percent": 10, "partner": bad}, known)


def test_shadowed_requests_of_many_small_messages_do_not_grow_the_router(tmp_path: Path) -> None:
    """Issue 43: shadowed chats of thousands of small messages grew the router ~2 MiB a request with no plateau
    (347 MiB against 17 MiB unshadowed after 160): the pair ring counted JSON bytes, not the dicts and strings
    it kept (8,000 one-character messages: ~2 MiB of objects, ~240 KB of JSON). Pairs keep at most
    MESSAGES_KEPT messages, as bytes, bounded in memory."""
    with ScriptedBackend("m-stable") as stable, ScriptedBackend("m-canary") as canary, \
            _router(tmp_path, stable.url, canary.url) as router:
        assert router.proc is not None
        router.admin().set_shadow("canary", 100, max_inflight=8)
        body = {"model": "pub", "max_tokens": 4,
                "messages": [{"role": "user" if i % 2 else "assistant", "content": "ok"} for i in range(6000)]}
        payload = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        with httpx.Client(timeout=60) as client:
            def send(n: int, done: int) -> None:
                for _ in range(n):
                    assert client.post(router.url + "/v1/chat/completions", content=payload,
                                       headers=headers).status_code == 200
                _wait(lambda: router.admin().shadow_pairs(since=done - 1).next == done, timeout=60)

            send(20, 20)
            before = _rss_kib(router.proc.pid)
            send(140, 160)
        grown_mib = (_rss_kib(router.proc.pid) - before) / 1024
        pairs = router.admin().shadow_pairs(since=150).pairs
        assert len(pairs) == 10 and all(len(p.request["messages"]) == 64 for p in pairs)
        assert grown_mib < 24, grown_mib  # was ~280 MiB over these 140 requests


def test_a_pair_keeps_the_first_system_messages_and_the_last_others_in_order() -> None:
    from qlift.router.pairs import MESSAGES_KEPT, SYSTEM_KEPT, _chosen

    messages: list[Any] = [{"role": "system", "content": f"s{i}"} for i in range(SYSTEM_KEPT + 2)]
    messages += [{"role": "user", "content": f"u{i}"} for i in range(100)] + ["not a message"]
    kept, cut = _chosen(messages)
    others = MESSAGES_KEPT - SYSTEM_KEPT
    assert cut and [m["content"] for m in kept] == [f"s{i}" for i in range(SYSTEM_KEPT)] + \
        [f"u{i}" for i in range(100 - others, 100)]
    few = messages[:3]
    assert _chosen(few) == (few, False)
