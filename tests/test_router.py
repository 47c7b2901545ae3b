"""qlift router against small real HTTP backends (no model): split, stickiness, failover, limits,
filter, logs, admin API, config errors, drain. The same router with real vLLM: test_router_vllm.py."""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from faults import FaultProxy, RouterProcess, TinyBackend, operator_headers, run_load

from qlift import httpclient
from qlift.errors import BadInputError, ExternalToolError
from qlift.router.balancer import Backend, Balancer
from qlift.router.client import RouterClient
from qlift.router.limits import KeyLimits, TokenBucket

TOKEN = "admin-secret"


def chat(url: str, model: str = "pub", *, stream: bool = False, headers: dict[str, str] | None = None,
         **extra: object) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": stream,
            **extra}
    return httpclient.post(f"{url}/v1/chat/completions", json=body, timeout=30,
                           headers={**operator_headers(url), **(headers or {})})


@pytest.fixture
def two_backends() -> Iterator[tuple[TinyBackend, TinyBackend]]:
    with TinyBackend("m-stable") as a, TinyBackend("m-canary") as b:
        yield a, b


def _router(tmp_path: Path, a: TinyBackend, b: TinyBackend, *extra: str, token: str | None = TOKEN,
            name: str = "router") -> RouterProcess:
    return RouterProcess("--backend", f"stable={a.url}", "--backend", f"canary={b.url}", "--public-model", "pub",
                         *extra, log_path=tmp_path / f"{name}.log", token=token)


# -- pure logic -------------------------------------------------------------------------


def test_sticky_keys_move_only_with_the_shifted_slice() -> None:
    bal = Balancer([Backend("stable", "u", "m", 90), Backend("canary", "u", "m", 10)])
    keys = [f"s{i}" for i in range(2000)]
    before = {k: bal.choose(k).name for k in keys}  # type: ignore[union-attr]
    bal.set_weights({"stable": 80, "canary": 20})
    after = {k: bal.choose(k).name for k in keys}  # type: ignore[union-attr]
    moved = Counter((before[k], after[k]) for k in keys if before[k] != after[k])
    assert set(moved) == {("stable", "canary")}  # canary's sessions stay; only the new 10% slice moves
    assert 150 < moved["stable", "canary"] < 250
    assert 8 < 100 * Counter(after.values())["canary"] / len(keys) - 10 < 12


def test_split_is_exact_per_100_requests_and_follows_no_pattern_in_the_traffic() -> None:
    bal = Balancer([Backend("stable", "u", "m", 50), Backend("canary", "u", "m", 50)])
    picks = [bal.choose().name for _ in range(1000)]  # type: ignore[union-attr]
    assert all(Counter(picks[i:i + 100])["canary"] == 50 for i in range(0, 1000, 100))
    # A client alternating long and short prompts: its long ones must not all land on one version
    # (smooth round-robin sent every even request to the stable).
    even_to_canary = sum(p == "canary" for p in picks[::2]) / 500
    assert 0.35 < even_to_canary < 0.65
    assert bal.choose(exclude={"canary"}).name == "stable"  # type: ignore[union-attr]
    bal.set_weights({"stable": 90, "canary": 10})
    assert Counter(bal.choose().name for _ in range(100))["canary"] == 10  # type: ignore[union-attr]


def test_token_buckets() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2.0, capacity=2, clock=lambda: now[0])
    assert bucket.take() == 0 and bucket.take() == 0
    assert bucket.take() == pytest.approx(0.5)
    now[0] += 0.5
    assert bucket.take() == 0
    limits = KeyLimits(None, None, tokens_per_min=60, clock=lambda: now[0])
    assert limits.admit("k") is None
    limits.charge_tokens("k", 90)  # 30 tokens in debt: 31 s until one token is back
    refusal = limits.admit("k")
    assert refusal is not None and refusal.reason == "rate_tokens" and refusal.retry_after_s == pytest.approx(31)


# -- the router process -----------------------------------------------------------------


def test_split_stickiness_public_name_and_admin(tmp_path: Path, two_backends) -> None:
    a, b = two_backends
    with _router(tmp_path, a, b, "--weight", "stable=90", "--weight", "canary=10") as router:
        models = httpclient.get(router.url + "/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["pub"]
        res = run_load(router.url, "pub", requests=400, concurrency=16, stream=False, timeout_s=60)
        assert res.errors == 0 and abs(res.share("canary") - 10) <= 5
        assert a.last_body["model"] == "m-stable" and b.last_body["model"] == "m-canary"  # rewritten per backend
        admin = router.admin()
        state = admin.set_weights({"stable": 50, "canary": 50})
        assert state.weights == {"stable": 50, "canary": 50}
        res = run_load(router.url, "pub", requests=400, concurrency=16, timeout_s=60)
        assert res.errors == 0 and abs(res.share("canary") - 50) <= 5
        for key_header in ({"X-Session-Id": "conversation-7"}, None):
            extra = {} if key_header else {"user": "user-42"}
            seen = {chat(router.url, headers=key_header, **extra).headers["X-Qlift-Backend"] for _ in range(20)}
            assert len(seen) == 1
        assert chat(router.url, model="m-stable").status_code == 404  # only the public name
        state = admin.state()
        assert sum(bk.requests for bk in state.backends) == 840 and state.seq == 840
        batch = admin.requests(since=838)
        assert [r.seq for r in batch.requests] == [839, 840] and batch.requests[0].ok
        with pytest.raises(BadInputError, match="sum to 100"):
            admin.set_weights({"stable": 50, "canary": 40})
        with pytest.raises(BadInputError, match="unknown backend"):
            admin.set_weights({"stable": 50, "blue": 50})
        assert httpclient.get(router.url + "/admin/state").status_code == 401
        with pytest.raises(BadInputError, match="QLIFT_ROUTER_TOKEN"):
            RouterClient(router.url, "wrong").state()
        assert router.metric("qlift_router_weight", backend="canary") == 50
    with pytest.raises(ExternalToolError):
        RouterClient(router.url, TOKEN, timeout=2).state()


def test_failover_replays_5xx_and_connect_errors_before_the_first_byte(tmp_path: Path, two_backends) -> None:
    a, b = two_backends
    with FaultProxy(b.url, fail_status=500) as broken:
        with _router(tmp_path, a, broken, "--weight", "stable=50", "--weight", "canary=50") as router:
            res = run_load(router.url, "pub", requests=100, concurrency=8, timeout_s=60)
            assert res.errors == 0, res.error_messages[:3]
            assert router.metric("qlift_router_requests_total", backend="canary", status_class="5xx") == 50
            assert router.metric("qlift_router_retries_total", backend="canary") == 50
            records = router.admin().requests().requests
            failed = [r for r in records if not r.ok]
            assert len(failed) == 50 and all(r.replayed and r.backend == "canary" and r.status == 500 for r in failed)
            replays = {r.request_id for r in failed}
            assert all(r.ok for r in records if r.request_id in replays and r.backend == "stable")
            state = router.admin().state()
            assert state.backend("canary").errors == 50
            # A stalled backend is replayed once its first-byte timeout passes.
            broken.fail_status, broken.stall = None, True
        cfg = tmp_path / "router.yaml"
        cfg.write_text("timeouts: {first_byte_s: 0.5}\nfailover_to_zero_weight: true\n")  # stable (0) is a spare
        with _router(tmp_path, a, broken, "--weight", "stable=0", "--weight", "canary=100", "--config", cfg,
                     name="stall") as router:
            r = chat(router.url)
            assert r.status_code == 200 and r.headers["X-Qlift-Backend"] == "stable"
            broken.kill()  # now a connect error: replayed too, and the backend leaves the rotation
            r = chat(router.url, stream=True)
            assert r.status_code == 200 and r.headers["X-Qlift-Backend"] == "stable"
            assert router.admin().state().backend("canary").healthy is False


def test_a_zero_weight_canary_never_serves_users(tmp_path: Path, two_backends) -> None:
    """Shadow phase (stable 100 / canary 0): the stable answers 500, then goes down. Users get the stable's
    error, then a 503; never the canary. Before, every request was replayed on the zero-weight canary and
    answered 200 by it. A spare at weight 0 is the operator's explicit choice (failover_to_zero_weight), and
    never the shadow version nor a version a rollout set to 0 through the admin API."""
    a, b = two_backends
    with FaultProxy(a.url, fail_status=500) as stable, \
            _router(tmp_path, stable, b, "--weight", "stable=100", "--weight", "canary=0") as router:
        router.admin().set_shadow("canary", 100)
        r = chat(router.url)
        assert r.status_code == 500 and r.headers["X-Qlift-Backend"] == "stable", r.text
        router.admin().clear_shadow()
        assert chat(router.url).status_code == 500 and chat(router.url, stream=True).status_code == 500
        stable.kill()
        _wait(lambda: not router.admin().state().backend("stable").healthy)
        r = chat(router.url)
        assert r.status_code == 503, r.text
        served = [rec.backend for rec in router.admin().requests().requests if rec.status == 200]
        assert served == [] and router.metric("qlift_router_requests_total", backend="canary", status_class="2xx") == 0
    cfg = tmp_path / "router.yaml"
    cfg.write_text("failover_to_zero_weight: true\n")
    with FaultProxy(a.url, fail_status=500) as stable, \
            _router(tmp_path, stable, b, "--weight", "stable=100", "--weight", "canary=0", "--config", cfg,
                    name="spare") as router:
        r = chat(router.url)
        assert r.status_code == 200 and r.headers["X-Qlift-Backend"] == "canary"  # the operator's spare
        router.admin().set_shadow("canary", 20)
        assert chat(router.url).status_code == 500  # the shadow version is no spare
        router.admin().clear_shadow()
        router.admin().set_weights({"stable": 100, "canary": 0})  # what a rollout's shadow phase or rollback sets
        assert chat(router.url).status_code == 500


def test_a_backend_whose_model_disappeared_leaves_the_rotation_and_no_user_sees_its_404(tmp_path: Path,
                                                                                       two_backends) -> None:
    """At 50/50 the canary's server stops serving its model (an adapter unloaded, a restart with other flags):
    vLLM answers 404 "The model `NAME` does not exist". Before, half the users got that 404, with the backend's
    own model name, for as long as the router ran, and the backend stayed healthy with no problem. Now the
    attempt is replayed before its first byte, counted as the canary's failure, and the canary is out of
    rotation (problem set) until /v1/models lists its model again."""
    a, b = two_backends
    with _router(tmp_path, a, b, "--weight", "stable=50", "--weight", "canary=50") as router:
        assert {chat(router.url).status_code for _ in range(4)} == {200}
        b.served_model = "m-other"  # what the canary's server serves now
        res = run_load(router.url, "pub", requests=20, concurrency=2, stream=False, timeout_s=60)
        assert res.errors == 0 and res.backends.get("canary", 0) == 0, res.error_messages[:3]
        canary = router.admin().state().backend("canary")
        assert not canary.healthy and canary.problem and "m-canary" in canary.problem
        gone = [r for r in router.admin().requests().requests if r.reason == "model_gone"]
        assert gone and all(r.backend == "canary" and r.replayed and not r.ok for r in gone)
        b.served_model = "m-canary"  # served again: back in rotation after a health check
        _wait(lambda: router.admin().state().backend("canary").healthy, timeout=20)
        assert router.admin().state().backend("canary").problem is None
        # Nowhere to replay: the client gets a 502 that does not name the backend's model.
        router.admin().set_weights({"stable": 0, "canary": 100})
        b.served_model = "m-other"
        r = chat(router.url)
        assert r.status_code == 502 and "m-canary" not in r.text and "m-other" not in r.text, r.text


def test_a_dropped_pooled_connection_is_resent_to_the_same_backend(tmp_path: Path) -> None:
    with TinyBackend("m") as a, RouterProcess("--backend", f"only={a.url}", "--public-model", "pub",
                                              log_path=tmp_path / "router.log", token=TOKEN) as router:
        assert chat(router.url).status_code == 200  # leaves a kept-alive connection in the pool
        a.drop_reused = 1
        for _ in range(5):  # a request may find the pooled connection busy with a health check
            r = chat(router.url, stream=True)
            assert r.status_code == 200, r.text
            if a.dropped:
                break
        assert a.dropped == 1
        assert router.metric("qlift_router_requests_total", backend="only", status_class="5xx") == 0
        assert router.admin().state().backend("only").errors == 0
        assert "dropped the connection before answering, resending" in router.log_tail(20)


def test_all_backends_down_is_503_and_health_brings_one_back(tmp_path: Path) -> None:
    with TinyBackend("m") as a:
        cfg = tmp_path / "router.yaml"
        cfg.write_text("health: {interval_s: 0.2, failures: 1}\n")
        with RouterProcess("--backend", f"only={a.url}", "--config", cfg, log_path=tmp_path / "r.log") as router:
            assert router.info["public_model"] == "m"  # asked from /v1/models
            a.healthy = False
            _wait(lambda: httpclient.get(router.url + "/health").status_code == 503)
            r = chat(router.url, model="m")
            assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
            assert router.metric("qlift_router_backend_healthy", backend="only") == 0
            a.healthy = True
            _wait(lambda: chat(router.url, model="m").status_code == 200)


def test_keys_limits_filter_size_and_request_id(tmp_path: Path, two_backends) -> None:
    a, b = two_backends
    keys = tmp_path / "keys.txt"
    hashed = hashlib.sha256(b"key-two").hexdigest()
    keys.write_text(f"# team keys\nkey-one alice\nsha256:{hashed} bob\n")
    words = tmp_path / "blocked.txt"
    words.write_text("forbidden\nre:secret\\s+plan\n")
    log = tmp_path / "access.jsonl"
    cfg = tmp_path / "router.yaml"
    cfg.write_text(f"api_keys_file: {keys.name}\nfilter_file: {words.name}\naccess_log: {log.name}\n"
                   "limits: {requests_per_s: 2, burst: 3}\nmax_request_bytes: 2048\n")
    with _router(tmp_path, a, b, "--config", cfg) as router:
        alice, bob = {"Authorization": "Bearer key-one"}, {"Authorization": "Bearer key-two"}
        r = chat(router.url, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert chat(router.url).status_code == 401
        r = chat(router.url, headers={**bob, "X-Request-Id": "req-123"}, stream=True)
        assert r.status_code == 200 and r.headers["X-Request-Id"] == "req-123"
        r = chat(router.url, headers=alice, messages=[{"role": "user", "content": "a Forbidden word"}])
        err = r.json()["error"]
        assert r.status_code == 400 and "blocked.txt:1" in err["message"] and "Forbidden" not in err["message"]
        r = chat(router.url, headers=alice, messages=[{"role": "user", "content": "the secret  plan"}])
        assert r.status_code == 400 and "blocked.txt:2" in r.json()["error"]["message"]
        statuses = [chat(router.url, headers=alice).status_code for _ in range(4)]  # burst 3 (+ refill)
        assert 429 in statuses
        r = chat(router.url, headers=alice)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert chat(router.url, headers=bob).status_code == 200  # buckets are per key
        words.write_text("allowed-now\nhello\n")  # hot reload: "hello" (in every prompt) is blocked now
        _wait(lambda: chat(router.url, headers=bob).status_code == 400)
        r = chat(router.url, headers=bob)
        assert r.status_code == 400 and "blocked.txt:2" in r.json()["error"]["message"]
        r = chat(router.url, headers=bob, messages=[{"role": "user", "content": "x" * 4000}])
        assert r.status_code == 413
        r = chat(router.url, headers=bob, messages=[{"role": "user", "content": "forbidden is fine now"}])
        assert r.status_code == 200 and len(r.headers["X-Request-Id"]) == 32
        assert router.metric("qlift_router_rejected_total", key="alice", reason="rate_requests") >= 2
        assert router.metric("qlift_router_rejected_total", key="alice", reason="filter") == 2
        assert router.metric("qlift_router_rejected_total", key="unknown", reason="auth") == 2
        assert router.metric("qlift_router_rejected_total", key="bob", reason="too_large") == 1
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    fields = {"time", "request_id", "key_id", "backend", "model", "stream", "status", "prompt_tokens",
              "completion_tokens", "finish_reason", "ttfb_s", "latency_s", "retried_from"}
    assert all(fields <= set(line) for line in lines)
    streamed = next(line for line in lines if line["request_id"] == "req-123")
    assert streamed["key_id"] == "bob" and streamed["stream"] is True and streamed["status"] == 200
    assert streamed["completion_tokens"] == 3 and streamed["prompt_tokens"] == 5  # usage asked for by the router
    assert streamed["finish_reason"] == "length" and streamed["ttfb_s"] <= streamed["latency_s"]
    assert "key-one" not in log.read_text() and "key-two" not in log.read_text()


def test_tokens_per_minute_limit_counts_usage(tmp_path: Path, two_backends) -> None:
    a, b = two_backends
    cfg = tmp_path / "router.yaml"
    cfg.write_text("limits: {tokens_per_min: 10}\n")  # each answer uses 5 prompt + 3 completion tokens
    with _router(tmp_path, a, b, "--config", cfg) as router:
        assert chat(router.url).status_code == 200
        assert chat(router.url, stream=True).status_code == 200  # 2 tokens were left: admitted, now in debt
        r = chat(router.url)
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_exceeded"
        assert 30 <= int(r.headers["Retry-After"]) <= 60  # 6 tokens of debt + 1 at 10/min
        assert router.metric("qlift_router_rejected_total", key="anonymous", reason="rate_tokens") == 1


def test_stream_passes_through_and_a_client_disconnect_cancels_upstream(tmp_path: Path, two_backends) -> None:
    a, b = two_backends
    a.tokens, a.chunk_delay_s = 50, 0.05
    with _router(tmp_path, a, b, "--weight", "stable=100", "--weight", "canary=0") as router:
        body = {"model": "pub", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        t0 = time.monotonic()
        with httpx.stream("POST", router.url + "/v1/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            ttfb = time.monotonic() - t0
        assert '"content":"hi "' in first and ttfb < 1.0  # the first chunk came at once, not at the end
        _wait(lambda: a.disconnects == 1)
        _wait(lambda: any(rec.client_disconnected for rec in router.admin().requests().requests))
        rec = router.admin().requests().requests[-1]
        assert rec.client_disconnected and rec.ok and rec.stream


def test_sigterm_drains_in_flight_streams(tmp_path: Path, two_backends) -> None:
    a, b = two_backends
    a.tokens, a.chunk_delay_s = 20, 0.05  # ~1 s streams
    router = _router(tmp_path, a, b, "--weight", "stable=100", "--weight", "canary=0").start()
    results: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: results.append(chat(router.url, stream=True)))
    thread.start()
    _wait(lambda: router.admin().state().backend("stable").in_flight == 1)
    assert router.proc is not None
    router.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    port = int(router.url.rsplit(":", 1)[1])
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass  # no longer listening
    thread.join(10)
    assert router.proc.wait(30) == 0  # exits by itself once the stream is done
    router.stop()
    assert results[0].status_code == 200 and results[0].text.rstrip().endswith("data: [DONE]")


def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, run_cli) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text("backends:\n  - name: stable\n    url: http://127.0.0.1:1\n    weight: 120\n")
    r = run_cli("router", "--config", cfg)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert str(cfg) in r.stderr and "backends.0.weight" in r.stderr
    cfg.write_text("backends: []\nlimits: {request_per_s: 3}\n")
    r = run_cli("router", "--config", cfg)
    assert r.exit_code == 2 and "limits.request_per_s" in r.stderr
    r = run_cli("router", "--backend", "a=http://127.0.0.1:1", "--backend", "b=http://127.0.0.1:2",
                "--weight", "a=60", "--weight", "b=60")
    assert r.exit_code == 2 and "sum to 120" in r.stderr
    r = run_cli("router", "--backend", "a=http://127.0.0.1:1", "--weight", "c=100")
    assert r.exit_code == 2 and "unknown backend 'c'" in r.stderr
    r = run_cli("router", "--backend", "nourl")
    assert r.exit_code == 2 and "NAME=URL" in r.stderr


def _wait(cond, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def test_the_admin_state_names_what_each_backend_serves_and_notices_a_restart_with_another(tmp_path: Path) -> None:
    """A rollout checks the canary's identity every window (qlift.rollout.identity): the configured model_hash, else
    the root its server lists, re-read when the backend comes back from being down."""
    with TinyBackend("m") as a, TinyBackend("m") as b:
        a.root, b.root = "/models/base", "/models/ft-v1"
        cfg = tmp_path / "router.yaml"
        cfg.write_text("health: {interval_s: 0.2, failures: 1}\nbackends:\n"
                       f"  - {{name: stable, url: '{a.url}', model_hash: abc123}}\n"
                       f"  - {{name: canary, url: '{b.url}'}}\n")
        with RouterProcess("--config", cfg, log_path=tmp_path / "r.log", token="t") as router:
            admin = router.admin()
            _wait(lambda: admin.state().backend("canary").identity is not None)
            assert admin.state().backend("stable").identity == "hash abc123"
            assert admin.state().backend("canary").identity == "root /models/ft-v1"
            b.healthy, b.root = False, "/models/ft-v2"  # restarted with another model dir
            _wait(lambda: not admin.state().backend("canary").healthy)
            b.healthy = True
            _wait(lambda: admin.state().backend("canary").identity == "root /models/ft-v2")
