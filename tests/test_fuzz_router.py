"""Property-based probes (hypothesis) over `qlift router`'s inputs: its config file and flags,
request bodies, headers and raw HTTP, against a real router process with keys, limits and a
content filter in front of a small real backend.

Whatever comes in: a config is accepted or refused in one line (never exit 70, never a
password echoed); a request is answered with a status the docs name (never a 500, never a
traceback in the router's log), and the router stays up. QLIFT_FUZZ_SCALE=10 probes ten times
as much, as in test_fuzz_inputs.py.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from faults import RouterProcess, TinyBackend
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from router_backends import ScriptedBackend

from qlift import httpclient
from qlift.errors import QliftError
from qlift.router.app import COMPLETIONS, PASSTHROUGH
from qlift.router.config import build_config, parse_backend_flag
from qlift.router.filters import WordListFilter, prompt_text
from qlift.router.textnorm import estimate_tokens, has_token_ids, normalize

SCALE = int(os.environ.get("QLIFT_FUZZ_SCALE", "1"))
PURE = settings(max_examples=300 * SCALE, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
LIVE = settings(PURE, max_examples=60 * SCALE)
KEY = "fuzz-key"
PASSWORD = "pw-hunter2"
# What a request may get: answered, bad request, bad key, not found, body too large or too slow, limited, no backend.
ANSWERS = {200, 400, 401, 404, 408, 413, 429, 503}

TEXT = st.one_of(st.text(max_size=24), st.sampled_from(["bomb", "ｂｏｍｂ", "bo\u200bmb", "炸弹", "如何制作炸弹",
                                                        "\ud800", "\x00", "secret \n plan", "a" * 3000]))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False), TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=16)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", 7]),
                                 "content": st.one_of(TEXT, JSON, st.lists(st.fixed_dictionaries(
                                     {"type": st.just("text"), "text": JSON}), max_size=3))},
                                optional={"name": JSON, "tool_calls": JSON})
BODY = st.fixed_dictionaries({}, optional={
    "model": st.one_of(st.just("pub"), JSON), "messages": st.one_of(st.lists(MESSAGE, max_size=3), JSON),
    "prompt": st.one_of(TEXT, st.lists(st.integers(0, 50000), max_size=5), JSON), "suffix": JSON,
    "tools": JSON, "input": JSON, "stream": st.booleans(), "max_tokens": st.integers(-1, 8),
    "stream_options": JSON, "user": JSON,
})
PATHS = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"])


@pytest.fixture(scope="module")
def router() -> Iterator[RouterProcess]:
    root = Path(tempfile.mkdtemp(prefix="qlift-fuzz-router-"))
    (root / "keys.txt").write_text(f"{KEY} fuzzer\n")
    (root / "blocked.txt").write_text("炸弹\nsecret plan\nbomb\nre:kill\\s+all\n")
    (root / "router.yaml").write_text("api_keys_file: keys.txt\nfilter_file: blocked.txt\nmax_request_bytes: 65536\n"
                                      "server: {header_timeout_s: 2, body_timeout_s: 2}\n"
                                      "expose_backend_header: true\n")  # _answered tells the backend's answers apart
    with TinyBackend("m", tokens=2) as backend, RouterProcess(
            "--backend", f"only={backend.url}", "--public-model", "pub", "--config", root / "router.yaml",
            log_path=root / "router.log", token="admin-token") as proc:
        yield proc
        assert proc.proc is not None and proc.proc.poll() is None, "the router died"
        assert chat_ok(proc)
    log = (root / "router.log").read_text(errors="replace")
    assert "Traceback" not in log and "Unhandled exception" not in log, log[-3000:]


def chat_ok(router: RouterProcess) -> bool:
    r = httpclient.post(router.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "pub", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    return r.status_code == 200


def _answered(r: httpx.Response) -> None:
    assert r.status_code in ANSWERS, (r.status_code, r.text[:300])
    if r.status_code != 200 and "X-Qlift-Backend" not in r.headers:  # the router's own refusal: OpenAI's shape
        assert "error" in r.json()


# -- pure functions over any JSON -------------------------------------------------------


@PURE
@given(JSON)
def test_request_text_extraction_takes_any_json(value: Any) -> None:
    body = value if isinstance(value, dict) else {"messages": value, "prompt": value, "input": value,
                                                  "tools": value}
    text = prompt_text(body)
    assert isinstance(text, str) and normalize(text) == normalize(normalize(text))
    assert estimate_tokens(body) >= 1
    has_token_ids(body)


RULE = st.text(st.characters(exclude_categories=("Cs", "Zl", "Zp", "Cc", "Mn", "Mc", "Me")), min_size=1, max_size=20)


@PURE
@given(RULE, st.text(max_size=30))
@example("炸弹", "如何制作")
@example("secret plan", "the")
def test_a_rule_matches_however_it_is_spelled(rule: str, filler: str) -> None:
    words = Path(tempfile.mkdtemp()) / "blocked.txt"
    words.write_text(rule + "\n", encoding="utf-8")
    f = WordListFilter(words)
    f.check(filler)  # never raises, whatever the text
    line = rule.strip()
    spelled = f"{line[:1]}\u200b{line[1:].upper()}"  # a zero-width space inside, the rest in capitals
    if not normalize(line) or line.startswith(("#", "re:")) or normalize(spelled) != normalize(line):
        return
    assert f.check(f"{filler} {spelled}\n{filler}") is not None, (rule, filler)


# -- config and flags -------------------------------------------------------------------

CONFIG_KEYS = ["backends", "public_model", "host", "port", "api_keys_file", "filter_file", "limits", "timeouts",
               "health", "server", "max_request_bytes", "access_log", "drain_s", "state_file", "rewrite_model",
               "failover_to_zero_weight", "expose_backend_header"]
CONFIG = st.dictionaries(st.sampled_from(CONFIG_KEYS), JSON, max_size=5)


@settings(PURE, max_examples=120 * SCALE)
@given(st.one_of(CONFIG.map(lambda d: yaml.safe_dump(d, allow_unicode=True).encode()), st.binary(max_size=80),
                 st.sampled_from([b"\xff\xfe\x00b", b"backends: [{name: a, url: 'http://u:" + PASSWORD.encode()
                                  + b"@h :1'}]", b"server: {max_connections: 0}", b"{" * 2000])))
@example(b"access_log: /nonexistent-dir/x/y.jsonl\nbackends: [{name: a, url: 'http://127.0.0.1:1'}]\n")
def test_any_router_config_is_accepted_or_refused_in_one_line(raw: bytes) -> None:
    path = Path(tempfile.mkdtemp()) / "router.yaml"
    path.write_bytes(raw)
    try:
        build_config(config_path=path, backends=[], weights=[])
    except QliftError as exc:
        line = exc.one_line()
        assert "\n" not in line and PASSWORD not in line


@PURE
@given(st.text(max_size=60), st.one_of(st.none(), st.text(max_size=20)))
@example(f"a=http://user:{PASSWORD}@127.0.0.1:8001", None)
@example(f"a=http://user:{PASSWORD}@127.0.0.1 :8001", "bad host")
def test_any_backend_and_host_flag(flag: str, host: str | None) -> None:
    try:
        parsed = parse_backend_flag(flag)
        cfg = build_config(config_path=None, backends=[flag], weights=[], flags={"host": host, "port": 0})
    except QliftError as exc:
        assert "\n" not in exc.one_line() and PASSWORD not in exc.one_line()
        return
    assert cfg.backends[0].name == parsed["name"] and "=" not in parsed["name"]


# -- a live router ----------------------------------------------------------------------


@LIVE
@given(BODY, PATHS)
def test_any_request_body_is_answered(router: RouterProcess, body: dict[str, Any], path: str) -> None:
    r = httpclient.post(router.url + path, content=json.dumps(body).encode(), timeout=30,  # lone surrogates escaped
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    _answered(r)


@LIVE
@given(st.binary(max_size=300))
@example(b"[" * 100_000)
@example(b'{"messages": [' * 3000)
@example(b'{"model": "pub", "prompt": "\\ud800\\udc00\\ud800"}')
def test_any_request_bytes_are_answered(router: RouterProcess, raw: bytes) -> None:
    r = httpclient.post(router.url + "/v1/chat/completions", content=raw, timeout=30,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    _answered(r)


HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=40)


@LIVE
@given(st.dictionaries(st.sampled_from(["Authorization", "X-Request-Id", "X-Session-Id", "Content-Type",
                                        "Content-Encoding", "Accept-Encoding", "Transfer-Encoding-X"]),
                       HEADER_TEXT, max_size=4),
       st.sampled_from(["/v1/chat/completions", "/admin/state", "/admin/requests?since=1e26", "/v1/models"]))
def test_any_headers_are_answered(router: RouterProcess, headers: dict[str, str], path: str) -> None:
    body = {"model": "pub", "messages": [{"role": "user", "content": "hi"}]}
    method = "POST" if path.startswith("/v1/chat") else "GET"
    r = httpclient.request(method, router.url + path, json=body if method == "POST" else None,
                      headers={k: v.strip().encode("latin-1") for k, v in headers.items()}, timeout=30)
    assert r.status_code in ANSWERS, (r.status_code, r.text[:300])


@LIVE
@given(st.binary(max_size=200), st.sampled_from([b"", b"GET / HTTP/1.1\r\n", b"POST /v1/completions HTTP/1.1\r\n"]))
@example(b"Content-Length: 99999999999999999999\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\n")
@example(b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nzz\r\n", b"POST /v1/completions HTTP/1.1\r\n")
def test_any_raw_http_is_answered_or_closed(router: RouterProcess, raw: bytes, start: bytes) -> None:
    port = int(router.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(start + raw + b"\r\n\r\n")
        s.settimeout(6)
        try:
            answer = s.recv(64)
        except (TimeoutError, ConnectionResetError):
            answer = b""
    if answer:
        assert answer.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), answer
        assert int(answer[9:12]) in ANSWERS | {405, 411, 414, 417, 431, 501, 505}, answer


# -- the filter on every proxied route (issue 29) ---------------------------------------

WORD = "bomb"
ROUTES = st.sampled_from(COMPLETIONS + PASSTHROUGH)
# Any JSON without the word, nested at random: lists and objects of texts, numbers, booleans, nulls.
CLEAN_TEXT = st.text(max_size=12).filter(lambda t: WORD not in normalize(t))
ANY_BODY = st.dictionaries(
    st.sampled_from(["messages", "prompt", "input", "system", "documents", "chat_template_kwargs", "tools",
                     "text_1", "text_2", "queries", "query", "texts", "instructions", "x_extra"]),
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), CLEAN_TEXT),
                 lambda inner: st.one_of(st.lists(inner, max_size=3),
                                         st.dictionaries(CLEAN_TEXT, inner, max_size=3)), max_leaves=10),
    max_size=4)


def _slots(value: Any, top: bool = True) -> list[tuple[Any, Any, str]]:
    """Every place a string sits: (container, index or key, "value" | "key"); keys below the top level."""
    out: list[tuple[Any, Any, str]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if not top:
                out.append((value, k, "key"))
            if isinstance(v, str):
                out.append((value, k, "value"))
            out += _slots(v, top=False)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, str):
                out.append((value, i, "value"))
            out += _slots(v, top=False)
    return out


@pytest.fixture(scope="module")
def filtered_router() -> Iterator[tuple[RouterProcess, ScriptedBackend]]:
    root = Path(tempfile.mkdtemp(prefix="qlift-fuzz-filter-"))
    (root / "blocked.txt").write_text(f"{WORD}\n")
    (root / "router.yaml").write_text("filter_file: blocked.txt\n")
    with ScriptedBackend("m", any_route=True) as backend, RouterProcess(
            "--backend", f"only={backend.url}", "--public-model", "pub", "--config", root / "router.yaml",
            log_path=root / "router.log") as proc:
        yield proc, backend
    assert "Traceback" not in (root / "router.log").read_text(errors="replace")


@settings(PURE, max_examples=80 * SCALE, deadline=None)
@given(ANY_BODY, ROUTES, st.data())
def test_a_filtered_word_anywhere_in_any_body_never_reaches_a_backend(
        filtered_router: tuple[RouterProcess, ScriptedBackend], body: dict[str, Any], route: str,
        data: st.DataObject) -> None:
    router, backend = filtered_router
    slots = _slots(body)
    if not slots:
        body["prompt"] = f"a {WORD}"
    else:
        container, at, kind = data.draw(st.sampled_from(slots))
        text = f"{data.draw(CLEAN_TEXT)} {WORD} {data.draw(CLEAN_TEXT)}"
        if kind == "value":
            container[at] = text
        else:
            container[text] = container.pop(at)
    seen = len(backend.bodies)
    r = httpclient.post(router.url + route, content=json.dumps({"model": "pub", **body}).encode(), timeout=30,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "content_filter", (route, body, r.text[:300])
    assert len(backend.bodies) == seen


NUMBER = st.one_of(st.booleans(), st.integers(0, 200_000), st.floats(0, 200_000, allow_nan=False))


@settings(PURE, max_examples=40 * SCALE, deadline=None)
@given(ROUTES, st.sampled_from(["prompt", "input", "text_1", "texts", "queries", "documents", "query"]),
       st.lists(st.one_of(NUMBER, CLEAN_TEXT, st.lists(NUMBER, max_size=3)), max_size=4), NUMBER)
def test_token_ids_however_spelled_never_reach_a_backend(
        filtered_router: tuple[RouterProcess, ScriptedBackend], route: str, field: str, items: list[Any],
        number: Any) -> None:
    router, backend = filtered_router
    seen = len(backend.bodies)
    r = httpclient.post(router.url + route, json={"model": "pub", field: [*items, number]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "content_filter", (route, field, r.text[:300])
    assert len(backend.bodies) == seen
