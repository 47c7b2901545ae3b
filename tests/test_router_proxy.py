"""qlift router's proxying against backends that misbehave on purpose: answers that are not answers,
the model name on the way back, the usage chunk, every vLLM route, a public name resolved late,
gzip, deadlines, the drain, weights kept across a restart, the admin token's whitespace."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from faults import RouterProcess, TinyBackend, operator_headers
from router_backends import NGINX, GzipNginx, ScriptedBackend

from qlift import httpclient
from qlift.router.client import RouterClient
from qlift.router.config import TimeoutsConfig, build_config

TOKEN = "admin-secret"


def _chat(url: str, *, stream: bool = False, model: str = "pub", path: str = "/v1/chat/completions",
          timeout: float = 30, **extra: object) -> httpx.Response:
    body: dict[str, object] = {"model": model, "max_tokens": 4, "stream": stream, **extra}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hello"}]
    else:
        body["prompt"] = "hello"
    return httpclient.post(url + path, json=body, timeout=timeout, headers=operator_headers(url))


def _events(text: str) -> list[str]:
    return [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]


def _wait(cond, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.parametrize("mode,reason", [("not_json", "bad_body"), ("error_object", "error_object"),
                                         ("no_choices", "no_choices")])
def test_a_200_that_is_not_an_answer_fails_over_and_counts_as_a_failure(tmp_path: Path, mode: str,
                                                                        reason: str) -> None:
    log = tmp_path / "access.jsonl"
    cfg = tmp_path / "router.yaml"
    cfg.write_text(f"access_log: {log.name}\nfailover_to_zero_weight: true\n")  # stable (0 here) takes replays
    with ScriptedBackend("m-stable") as good, ScriptedBackend("m-canary", mode=mode) as bad, \
            RouterProcess("--backend", f"stable={good.url}", "--backend", f"canary={bad.url}", "--public-model", "pub",
                          "--weight", "stable=0", "--weight", "canary=100", "--config", cfg,
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        for _ in range(4):
            r = _chat(router.url)
            assert r.status_code == 200 and r.headers["X-Qlift-Backend"] == "stable"  # the client never sees it
            assert r.json()["choices"][0]["message"]["content"]
        records = router.admin().requests().requests
        failed = [rec for rec in records if rec.backend == "canary"]
        assert len(failed) == 4 and all(not rec.ok and rec.reason == reason and rec.replayed for rec in failed)
        assert all(rec.ok and rec.reason is None for rec in records if rec.backend == "stable")
        assert router.metric("qlift_router_failures_total", backend="canary", reason=reason) == 4
        assert router.metric("qlift_router_requests_total", backend="canary", status_class="error") == 4
        assert router.metric("qlift_router_requests_total", backend="canary", status_class="2xx") == 0
        assert router.admin().state().backend("canary").errors == 4
        # Nowhere else to go: a 502 naming the reason, never the garbage with a 200.
        router.admin().set_weights({"stable": 100, "canary": 0})
        good.close()
        _wait(lambda: not router.admin().state().backend("stable").healthy)
        router.admin().set_weights({"stable": 0, "canary": 100})
        r = _chat(router.url)
        assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_error", r.text
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["reason"] for line in lines if line["backend"] == "canary"][-1] == reason
    assert all(line["reason"] is None for line in lines[:4])  # the client's requests were fine


def test_an_openai_sdk_stream_closed_right_after_done_is_logged_complete(tmp_path: Path) -> None:
    """The openai SDK closes its stream as soon as it reads [DONE]; here the backend takes 1 s to end the stream
    after it (the race every vLLM stream runs, made certain), so the router sees the client leave before the
    backend's end. Every token and the finish reason went through: a 200, not a 499."""
    import openai

    log = tmp_path / "access.jsonl"
    cfg = tmp_path / "router.yaml"
    cfg.write_text(f"access_log: {log.name}\n")
    with ScriptedBackend("m", tokens=5, done_linger_s=1.0) as a, \
            RouterProcess("--backend", f"only={a.url}", "--public-model", "pub", "--config", cfg,
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        sdk = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0, timeout=30,
                            default_headers=operator_headers(router.url))
        for _ in range(2):
            chunks = list(sdk.chat.completions.create(model="pub", messages=[{"role": "user", "content": "hi"}],
                                                      stream=True))
            assert [c.choices[0].finish_reason for c in chunks][-1] == "length" and len(chunks) == 5
        _wait(lambda: len(router.admin().requests().requests) == 2)
        records = router.admin().requests().requests
        assert all(rec.ok and not rec.client_disconnected and rec.finish_reason == "length" for rec in records)
        assert router.metric("qlift_router_requests_total", backend="only", status_class="2xx") == 2
        # per-token latency as the judge takes it: decode time over the 4 tokens after the first, each
        per_token = [(rec.latency_s - rec.ttfb_s) / 4 for rec in records if rec.ttfb_s is not None]
        assert router.metric("qlift_router_token_latency_seconds_count", backend="only", stream="true") == 2
        assert router.metric("qlift_router_token_latency_seconds_sum", backend="only",
                             stream="true") == pytest.approx(sum(per_token), rel=1e-3)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(line["status"], line["client_disconnected"]) for line in lines] == [(200, False)] * 2


def test_a_stream_without_done_is_a_failed_request(tmp_path: Path) -> None:
    with ScriptedBackend("m", mode="no_done") as bad, \
            RouterProcess("--backend", f"only={bad.url}", "--public-model", "pub",
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        r = _chat(router.url, stream=True)
        assert r.status_code == 200 and _events(r.text)[-1] != "[DONE]"
        rec = router.admin().requests().requests[-1]
        assert not rec.ok and rec.reason == "no_done" and rec.stream
        assert router.metric("qlift_router_failures_total", backend="only", reason="no_done") == 1
        assert router.metric("qlift_router_requests_total", backend="only", status_class="error") == 1


def test_answers_name_the_public_model_and_the_usage_chunk_goes_only_to_who_asked(tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    cfg = tmp_path / "router.yaml"
    cfg.write_text(f"access_log: {log.name}\n")
    with ScriptedBackend("m-stable") as a, \
            RouterProcess("--backend", f"stable={a.url}", "--public-model", "pub", "--config", cfg,
                          log_path=tmp_path / "router.log", token=TOKEN) as router:  # the admin token's caller
        for path in ("/v1/chat/completions", "/v1/completions"):
            r = _chat(router.url, path=path, stream=True)
            events = _events(r.text)
            chunks = [json.loads(e) for e in events[:-1]]
            assert events[-1] == "[DONE]" and r.headers["X-Qlift-Backend"] == "stable"
            assert all(c["choices"] for c in chunks), "a usage chunk the client did not ask for"
            assert {c["model"] for c in chunks} == {"pub"}
            assert a.bodies[-1]["stream_options"] == {"include_usage": True}  # the router still asked for it
            r = _chat(router.url, path=path, stream=True, stream_options={"include_usage": True})
            chunks = [json.loads(e) for e in _events(r.text)[:-1]]
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
            assert {c["model"] for c in chunks} == {"pub"}
            r = _chat(router.url, path=path)
            assert r.json()["model"] == "pub" and r.headers["X-Qlift-Backend"] == "stable"
    streamed = [json.loads(line) for line in log.read_text().splitlines() if '"stream":true' in line]
    assert streamed and all(line["completion_tokens"] == 3 for line in streamed)  # usage still counted
    cfg.write_text("rewrite_model: false\n")  # for debugging: the backend's own name
    with ScriptedBackend("m-stable") as a, \
            RouterProcess("--backend", f"stable={a.url}", "--public-model", "pub", "--config", cfg,
                          log_path=tmp_path / "router2.log") as router:
        assert _chat(router.url).json()["model"] == "m-stable"


def test_every_vllm_route_is_proxied_with_the_model_name_rewritten(tmp_path: Path) -> None:
    with ScriptedBackend("m-stable") as a, \
            RouterProcess("--backend", f"stable={a.url}", "--public-model", "pub",
                          log_path=tmp_path / "router.log") as router:
        models = httpclient.get(router.url + "/v1/models").json()["data"]
        assert len(models) == 1 and models[0]["id"] == "pub"
        assert models[0]["max_model_len"] == 2048 and "root" not in models[0]  # backend's fields, not its identity
        one = httpclient.get(router.url + "/v1/models/pub")
        assert one.status_code == 200 and one.json()["id"] == "pub" and one.json()["max_model_len"] == 2048
        missing = httpclient.get(router.url + "/v1/models/m-stable")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        r = httpclient.post(router.url + "/tokenize", json={"model": "pub", "prompt": "hello"})
        assert r.status_code == 200 and r.json()["count"] == 3 and r.json()["model"] == "pub"
        assert a.bodies[-1]["model"] == "m-stable" and a.paths[-1] == "/tokenize"
        r = httpclient.post(router.url + "/tokenize", json={"prompt": "no model named"})
        assert r.status_code == 200 and a.bodies[-1]["model"] == "m-stable"
        r = httpclient.post(router.url + "/v1/responses", json={"model": "pub", "input": "hi"})
        assert r.status_code == 200 and r.json()["model"] == "pub"
        r = httpclient.post(router.url + "/v1/embeddings", json={"model": "pub", "input": "hi"})
        assert r.status_code == 404  # the backend's own answer: it does not serve embeddings
        assert httpclient.post(router.url + "/tokenize", json={"model": "other", "prompt": "x"}).status_code == 404


def test_the_public_name_waits_for_the_first_backend_and_never_becomes_a_backend_name(tmp_path: Path) -> None:
    first = ScriptedBackend("m-first")  # not started yet: down when the router starts
    cfg = tmp_path / "router.yaml"
    cfg.write_text("health: {interval_s: 0.2, failures: 1}\n")
    with ScriptedBackend("m-second") as second, \
            RouterProcess("--backend", f"first={first.url}", "--backend", f"second={second.url}", "--config", cfg,
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        assert router.info["public_model"] is None
        r = _chat(router.url, model="m-first")
        assert r.status_code == 503 and "--public-model" in r.json()["error"]["message"]
        assert _chat(router.url, model="first").status_code == 503  # never the backend's short name
        with first:
            _wait(lambda: router.admin().state().public_model == "m-first")
            r = _chat(router.url, model="m-first")
            assert r.status_code == 200 and r.json()["model"] == "m-first"
            assert [m["id"] for m in httpclient.get(router.url + "/v1/models").json()["data"]] == ["m-first"]


def test_a_backend_is_a_server_plus_a_model_name(tmp_path: Path, run_cli) -> None:
    cfg = build_config(config_path=None, backends=["a=http://127.0.0.1:1#org/model-x"], weights=[])
    assert cfg.backends[0].url == "http://127.0.0.1:1" and cfg.backends[0].served_model == "org/model-x"
    yaml_cfg = tmp_path / "r.yaml"
    yaml_cfg.write_text("backends:\n  - {name: a, url: 'http://127.0.0.1:1/v1#m'}\n")
    cfg = build_config(config_path=yaml_cfg, backends=[], weights=[])
    assert cfg.backends[0].url == "http://127.0.0.1:1" and cfg.backends[0].served_model == "m"
    with ScriptedBackend("m-stable") as a:
        with RouterProcess("--backend", f"stable={a.url}#m-stable", "--public-model", "pub",
                           log_path=tmp_path / "ok.log", token=TOKEN) as router:
            assert _chat(router.url).status_code == 200 and a.bodies[-1]["model"] == "m-stable"
        with RouterProcess("--backend", f"stable={a.url}#m-other", "--public-model", "pub",
                           log_path=tmp_path / "wrong.log", token=TOKEN) as router:
            state = router.admin().state()
            assert not state.backend("stable").healthy
            assert "'m-other' is not listed" in (state.backend("stable").problem or "")
            assert _chat(router.url).status_code == 503
        assert "'m-other' is not listed at /v1/models (it lists m-stable)" in (tmp_path / "wrong.log").read_text()


@pytest.mark.skipif(not NGINX.exists(), reason="nginx is not installed")
def test_a_compressing_backend_reaches_clients_as_plain_json(tmp_path: Path) -> None:
    with TinyBackend("m") as a, GzipNginx(a.url, tmp_path / "nginx") as gz:
        direct = httpclient.post(gz.url + "/v1/chat/completions", headers={"Accept-Encoding": "gzip"},
                            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert direct.headers.get("content-encoding") == "gzip"  # nginx does compress
        with RouterProcess("--backend", f"gz={gz.url}", "--public-model", "pub",
                           log_path=tmp_path / "router.log", token=TOKEN) as router:
            assert router.admin().state().backend("gz").healthy
            with httpx.Client(headers={"Accept-Encoding": "identity"}) as client:  # raw bytes as they come
                r = client.post(router.url + "/v1/chat/completions",
                                json={"model": "pub", "messages": [{"role": "user", "content": "hi"}]})
                assert "content-encoding" not in r.headers and r.json()["choices"][0]["message"]["content"]
                r = client.post(router.url + "/v1/chat/completions", json={
                    "model": "pub", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
                assert _events(r.text)[-1] == "[DONE]"
            assert [m["id"] for m in httpclient.get(router.url + "/v1/models").json()["data"]] == ["pub"]


def test_a_stream_of_sse_comments_ends_at_the_request_deadline(tmp_path: Path) -> None:
    defaults = TimeoutsConfig()
    assert defaults.request_s == 600 and defaults.idle_s == 30 and defaults.first_byte_s is None
    cfg = tmp_path / "router.yaml"
    cfg.write_text("timeouts: {request_s: 2}\n")
    with ScriptedBackend("m", mode="comments") as a, \
            RouterProcess("--backend", f"only={a.url}", "--public-model", "pub", "--config", cfg,
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        t0 = time.monotonic()
        r = _chat(router.url, stream=True, timeout=30)
        took = time.monotonic() - t0
        assert 1.9 <= took < 6, took
        assert "request deadline" in _events(r.text)[-1]
        rec = router.admin().requests().requests[-1]
        assert rec.reason == "deadline" and not rec.ok


def test_sigterm_drains_a_stream_once_bounded_by_drain_s(tmp_path: Path) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text("drain_s: 2\n")
    with ScriptedBackend("m", tokens=200, chunk_delay_s=0.1) as a:  # a 20 s stream
        router = RouterProcess("--backend", f"only={a.url}", "--public-model", "pub", "--config", cfg,
                               log_path=tmp_path / "router.log", token=TOKEN).start()
        try:
            results: list[str] = []

            def client() -> None:
                try:
                    results.append(_chat(router.url, stream=True, timeout=60).text)
                except httpx.HTTPError as exc:  # cut mid-stream: the chunked body never ends
                    results.append(type(exc).__name__)

            thread = threading.Thread(target=client)
            thread.start()
            _wait(lambda: router.admin().state().backend("only").in_flight == 1)
            assert router.proc is not None
            t0 = time.monotonic()
            router.proc.send_signal(signal.SIGTERM)
            assert router.proc.wait(20) == 0
            took = time.monotonic() - t0
            thread.join(30)
        finally:
            router.stop()
    assert 1.9 <= took < 3.5, f"drain took {took:.2f} s for drain_s 2"  # today: twice drain_s
    assert results and "[DONE]" not in results[0]  # cut at drain_s


def test_admin_weights_and_shadow_survive_a_restart(tmp_path: Path) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text("public_model: pub\n")
    state = tmp_path / "router.state.json"
    with TinyBackend("m-stable") as a, TinyBackend("m-canary") as b:
        args = ("--backend", f"stable={a.url}", "--backend", f"canary={b.url}", "--weight", "stable=90",
                "--weight", "canary=10", "--config", cfg)
        with RouterProcess(*args, log_path=tmp_path / "r1.log", token=TOKEN) as router:
            router.admin().set_weights({"stable": 50, "canary": 50})
            router.admin().set_shadow("canary", 20, max_inflight=2)
        saved = json.loads(state.read_text())
        assert saved["weights"] == {"stable": 50, "canary": 50} and saved["shadow"]["percent"] == 20
        with RouterProcess(*args, log_path=tmp_path / "r2.log", token=TOKEN) as router:
            st = router.admin().state()
            assert st.weights == {"stable": 50, "canary": 50}
            assert st.shadow is not None and st.shadow.version == "canary" and st.shadow.sent == 0
            assert router.metric("qlift_router_weight", backend="canary") == 50
            router.admin().clear_shadow()
        assert json.loads(state.read_text())["shadow"] is None
        state.write_text("{not json")  # a damaged file: the configured weights, one warning
        with RouterProcess(*args, log_path=tmp_path / "r3.log", token=TOKEN) as router:
            assert router.admin().state().weights == {"stable": 90, "canary": 10}
        assert "state file" in (tmp_path / "r3.log").read_text()


def test_a_router_token_with_surrounding_whitespace_still_authenticates(tmp_path: Path) -> None:
    with TinyBackend("m") as a, RouterProcess("--backend", f"only={a.url}", "--public-model", "pub",
                                              log_path=tmp_path / "router.log", token="admin-secret \n") as router:
        assert router.info["admin"] is True
        assert RouterClient(router.url, "admin-secret").state().public_model == "pub"


def test_a_client_never_learns_which_version_answered(tmp_path: Path) -> None:
    """Issue 29: /v1/models copied the backend's root (its model directory) and parent, and every answer
    carried X-Qlift-Backend. Both are for the operator only: the admin token, or expose_backend_header."""
    with ScriptedBackend("m-stable") as a, RouterProcess("--backend", f"stable={a.url}", "--public-model", "pub",
                                                         log_path=tmp_path / "router.log", token=TOKEN) as router:
        admin = {"Authorization": f"Bearer {TOKEN}"}
        for path in ("/v1/models", "/v1/models/pub"):
            r = httpclient.get(router.url + path)
            entry = r.json()["data"][0] if path == "/v1/models" else r.json()
            assert entry["id"] == "pub" and entry["max_model_len"] == 2048, entry
            assert "root" not in entry and "parent" not in entry and "m-stable" not in r.text, r.text
            r = httpclient.get(router.url + path, headers=admin)
            entry = r.json()["data"][0] if path == "/v1/models" else r.json()
            assert entry["root"] == "/models/m-stable" and "parent" in entry
        body = {"model": "pub", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        for stream in (False, True):
            r = httpclient.post(router.url + "/v1/chat/completions", json={**body, "stream": stream}, timeout=30)
            assert r.status_code == 200 and "X-Qlift-Backend" not in r.headers and "X-Request-Id" in r.headers
            r = httpclient.post(router.url + "/v1/chat/completions", json={**body, "stream": stream}, headers=admin,
                           timeout=30)
            assert r.headers["X-Qlift-Backend"] == "stable"
        r = httpclient.post(router.url + "/tokenize", json={"model": "pub", "prompt": "x"},
                       headers={"Authorization": "Bearer not-the-token"})
        assert r.status_code == 200 and "X-Qlift-Backend" not in r.headers
    with ScriptedBackend("m-stable", mode="error_object") as a, RouterProcess(
            "--backend", f"stable={a.url}", "--public-model", "pub", log_path=tmp_path / "router2.log") as router:
        r = httpclient.post(router.url + "/v1/chat/completions", json=body, timeout=30)  # the failure handed over
        assert r.status_code == 502 and "X-Qlift-Backend" not in r.headers
    cfg = tmp_path / "router.yaml"
    cfg.write_text("expose_backend_header: true\n")
    with ScriptedBackend("m-stable") as a, RouterProcess("--backend", f"stable={a.url}", "--public-model", "pub",
                                                         "--config", cfg, log_path=tmp_path / "router3.log") as router:
        r = httpclient.post(router.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.headers["X-Qlift-Backend"] == "stable"
