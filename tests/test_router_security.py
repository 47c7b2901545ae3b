"""The router as an attacker or a careless client meets it (issue 20, gateway security): token
limits a client cannot dodge by leaving early, a content filter that sees through spelling and
every text field, filter reloads that fail closed, slow and abusive connections, credentials in
backend URLs, deeply nested JSON, malformed HTTP, the bearer scheme, and bad router inputs that
must be clean exits. Real `qlift router` processes on 127.0.0.1 against small real backends."""

from __future__ import annotations

import hashlib
import json
import logging
import resource
import socket
import time
from pathlib import Path

import httpx
import pytest
from faults import RouterProcess, TinyBackend

from qlift import httpclient
from qlift.errors import BadInputError
from qlift.router.config import parse_backend_flag, redact_url, url_problem
from qlift.router.filters import WordListFilter, prompt_text
from qlift.router.limits import ApiKeys, bearer_token, tokens_used
from qlift.router.serverlimits import OncePerInterval
from qlift.router.textnorm import INVISIBLE_RANGES, estimate_tokens, has_token_ids, normalize

TOKEN = "admin-secret"
BLOCKED = "炸弹\nsecret plan\nbomb\nre:kill\\s+them\\s+all\n"


def chat(url: str, content: str = "hello", *, headers: dict[str, str] | None = None, **extra: object) -> httpx.Response:
    body = {"model": "pub", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}
    return httpclient.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}, timeout=30)


def _router(tmp_path: Path, backend: TinyBackend, config: str = "", *extra: str, name: str = "router",
            url: str | None = None) -> RouterProcess:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(config or "{}\n")
    return RouterProcess("--backend", f"only={url or backend.url}", "--public-model", "pub", "--config", cfg,
                         *extra, log_path=tmp_path / f"{name}.log", token=TOKEN)


def _wait(cond, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


# -- pure logic --------------------------------------------------------------------------


def test_normalize_sees_through_spelling() -> None:
    assert normalize("ＢＯＭＢ") == "bomb"  # full-width
    assert normalize("bo\u200bmb\u2060") == "bomb"  # zero-width space, word joiner
    assert normalize("se\u00adcret\u202e  \n\t plan ") == "secret plan"  # soft hyphen, bidi override, whitespace
    assert normalize("ﬁle Straße") == "file strasse"  # ligature (NFKC), casefold
    assert normalize("a\x00b\x7f") == "ab"


def test_invisible_ranges_cover_this_pythons_format_characters() -> None:
    import sys
    import unicodedata

    covered = {c for lo, hi in INVISIBLE_RANGES for c in range(lo, hi + 1)}
    missing = [hex(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"
               or (unicodedata.category(chr(c)) == "Cc" and not chr(c).isspace()) if c not in covered]
    assert not missing


def test_word_list_matches_cjk_as_substrings_and_other_words_whole(tmp_path: Path) -> None:
    words = tmp_path / "blocked.txt"
    words.write_text(BLOCKED)
    f = WordListFilter(words)
    blocked = ["如何制作炸弹", "炸 弹", "炸\n弹", "ｂｏｍｂ", "bo\u200bmb", "a BOMB!", "我想做bomb吗",
               "the secret  \n plan", "SECRET\u00a0PLAN", "kill   them all"]
    for text in blocked:
        assert f.check(text) is not None, text
    for text in ["bombastic", "bo mb", "secretplan", "a secret, the plan", "炸", "kill them"]:
        assert f.check(text) is None, text
    assert f.check("如何制作炸弹").rule == "blocked.txt:1"  # type: ignore[union-attr]


def test_every_text_field_of_a_request_is_checked(tmp_path: Path) -> None:
    words = tmp_path / "blocked.txt"
    words.write_text("bomb\n")
    f = WordListFilter(words)
    bodies = [
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a bomb"}]}]},
        {"messages": [{"role": "user", "content": "hi", "name": "bomb"}]},
        {"messages": [{"role": "assistant",
                       "tool_calls": [{"function": {"name": "f", "arguments": '{"x": "bomb"}'}}]}]},
        {"messages": [{"role": "user", "content": "hi"}],
         "tools": [{"type": "function", "function": {"name": "f", "description": "makes a bomb"}}]},
        {"messages": [], "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "string", "description": "the bomb"}}}}}]},
        {"prompt": "hi", "suffix": "bomb"},
        {"prompt": ["fine", "bomb"]},
        {"input": "bomb"},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "bomb"}]}]},
        {"instructions": "bomb", "input": "hi"},
    ]
    for body in bodies:
        assert f.check(prompt_text(body)) is not None, body
    assert has_token_ids({"prompt": [1, 2, 3]}) and has_token_ids({"prompt": [[1, 2], [3]]})
    assert has_token_ids({"input": [7, 8]}) and not has_token_ids({"prompt": ["a"]})
    assert has_token_ids({"prompt": "", "prompt_embeds": "AAAA"})  # vLLM's prompt embeddings: no text to read


def test_filter_reload_fails_closed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    words = tmp_path / "blocked.txt"
    words.write_text("bomb\n")
    failures: list[int] = []
    f = WordListFilter(words, check_every_s=0, on_reload_failed=lambda: failures.append(1))
    caplog.set_level(logging.WARNING, "qlift.router.filters")
    words.write_bytes(b"bomb\nbad \xff\xfe utf-8\n")
    for _ in range(5):
        assert f.check("a bomb") is not None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]  # the load's INFO line may be kept too
    assert len(failures) == 1 and len(warnings) == 1 and "not UTF-8" in warnings[0].getMessage()
    words.write_text("")  # an editor mid-save
    assert f.check("a bomb") is not None and len(failures) == 2
    words.write_text("re:(unclosed\n")
    assert f.check("a bomb") is not None and len(failures) == 3
    words.write_text("other\n")
    assert f.check("a bomb") is None and f.check("other") is not None and len(failures) == 3
    with pytest.raises(BadInputError, match="not UTF-8"):
        WordListFilter(_write(tmp_path / "bad.txt", b"\xff"))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_token_accounting() -> None:
    assert estimate_tokens({"messages": [{"role": "user", "content": "x" * 400}]}) >= 100
    assert estimate_tokens({"messages": [{"role": "user", "content": "炸" * 100}]}) >= 100
    assert estimate_tokens({"prompt": [1] * 50}) >= 50
    assert tokens_used(40, 31, 16, 3) == 47  # usage wins over the estimate
    assert tokens_used(40, None, None, 12) == 52  # no usage (client left): estimate + streamed events


def test_bearer_tokens_and_keys_file(tmp_path: Path) -> None:
    for header in ("Bearer tok", "bearer tok", "BEARER  tok ", "Bearer\ttok"):
        assert bearer_token(header) == "tok", header
    for header in ("tok", "Basic tok", "Bearer", "Bearer   ", "", None, "Bearertok"):
        assert bearer_token(header) is None, header
    keys = tmp_path / "keys.txt"
    keys.write_text("  key-one\talice  \nkey-two \n")
    k = ApiKeys.load(keys)
    assert k.identify("key-one") == "alice" and k.identify("key-two") is not None
    with pytest.raises(BadInputError, match="cannot read"):
        ApiKeys.load(tmp_path)
    with pytest.raises(BadInputError, match="not UTF-8"):
        ApiKeys.load(_write(tmp_path / "k2", b"\xff\xfe"))


def test_backend_urls_with_credentials() -> None:
    assert parse_backend_flag("a=http://user:pw@host:8001")["url"] == "http://user:pw@host:8001"
    assert parse_backend_flag("a=http://user:pw@host")["url"] == "http://user:pw@host"
    assert parse_backend_flag("a=http://u:p@h:1#m") == {"name": "a", "url": "http://u:p@h:1", "served_model": "m"}
    assert parse_backend_flag("a=http://127.0.0.1:8001@smollm2")["served_model"] == "smollm2"
    assert parse_backend_flag("a=http://h:1/x?k=v=w")["url"] == "http://h:1/x?k=v=w"  # split at the first '='
    assert redact_url("GET http://user:pw@h:1/x failed") == "GET http://***@h:1/x failed"
    assert url_problem("http://127.0.0.1 :9") and url_problem("http://h:99999") and url_problem("ftp://h")
    assert url_problem("http://u:p@h:1") is None
    with pytest.raises(BadInputError) as err:
        parse_backend_flag("http://user:pw@host")
    assert "pw" not in err.value.one_line()


def test_errors_are_logged_once_per_interval() -> None:
    now = [0.0]
    guard = OncePerInterval(60, clock=lambda: now[0])
    logger = logging.getLogger("qlift-test-guard")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(self.format(record))

    logger.addHandler(Keep())
    logger.addFilter(guard)
    logger.propagate = False
    for i in range(500):
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            logger.exception("accept failed for %s", f"client {i}")
    now[0] += 61
    try:
        raise OSError(24, "Too many open files")
    except OSError:
        logger.exception("accept failed for %s", "late client")
    logger.error("socket.accept() out of system resource\nsocket: <fd=7>")  # asyncio's two-line message
    assert len(seen) == 3 and all("\n" not in line and "Traceback" not in line for line in seen)
    assert "499 more like it" in seen[1] and seen[2].endswith("resource; socket: <fd=7>")


# -- the router process ------------------------------------------------------------------


def test_a_client_leaving_streams_early_is_still_charged(tmp_path: Path) -> None:
    """14 streams abandoned after their first chunks against 300 tokens/min: most must be refused."""
    with TinyBackend("m", tokens=200, chunk_delay_s=0.02) as backend, \
            _router(tmp_path, backend, "limits: {tokens_per_min: 300}\n") as router:
        body = {"model": "pub", "stream": True, "max_tokens": 200,
                "messages": [{"role": "user", "content": "tell me a long story " * 10}]}
        statuses = []
        for _ in range(14):
            with httpx.stream("POST", router.url + "/v1/chat/completions", json=body, timeout=30) as r:
                statuses.append(r.status_code)
                if r.status_code == 200:
                    lines = r.iter_lines()
                    for _ in range(10):  # a few chunks, then leave before the usage chunk
                        next(lines)
            time.sleep(0.1)
        assert statuses.count(200) <= 6, statuses
        assert statuses[-1] == 429
        assert router.metric("qlift_router_rejected_total", key="anonymous", reason="rate_tokens") >= 8


def test_the_prompt_charge_is_refunded_when_no_backend_was_asked(tmp_path: Path) -> None:
    with TinyBackend("m") as backend:
        backend.healthy = False
        with _router(tmp_path, backend, "limits: {tokens_per_min: 300}\nhealth: {interval_s: 0.2, failures: 1}\n") \
                as router:
            for _ in range(10):  # ~100 tokens of prompt each, 1,000 in all: far over the budget if kept
                assert chat(router.url, "tell me a long story " * 20).status_code == 503
            backend.healthy = True
            _wait(lambda: httpclient.get(router.url + "/health").status_code == 200)
            assert chat(router.url, "hello").status_code == 200


def test_filter_through_the_router(tmp_path: Path) -> None:
    words = tmp_path / "blocked.txt"
    words.write_text(BLOCKED)
    with TinyBackend("m") as backend, _router(tmp_path, backend, f"filter_file: {words.name}\n") as router:
        for content in ("如何制作炸弹", "ｂｏｍｂ", "bo\u200bmb", "the secret \n plan"):
            r = chat(router.url, content)
            assert r.status_code == 400 and r.json()["error"]["code"] == "content_filter", content
            assert "炸弹" not in r.text and "bomb" not in r.text.lower()
        r = chat(router.url, "hi", tools=[{"type": "function", "function": {"name": "f", "description": "a bomb"}}])
        assert r.status_code == 400
        r = chat(router.url, "hi", messages=[{"role": "user", "content": "hi", "name": "bomb"}])
        assert r.status_code == 400
        r = httpclient.post(router.url + "/v1/completions", json={"model": "pub", "prompt": "hi", "suffix": "bomb"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "content_filter"
        r = httpclient.post(router.url + "/v1/completions", json={"model": "pub", "prompt": [101, 2054, 102]})
        assert r.status_code == 400 and "token ids" in r.json()["error"]["message"]
        assert chat(router.url, "bombastic").status_code == 200
        assert router.metric("qlift_router_rejected_total", key="anonymous", reason="filter") == 8
        words.write_bytes(b"\xff\xfe not utf-8")  # a broken reload keeps the rules
        # the filter notices a changed file when a request comes (at most once a second)
        _wait(lambda: chat(router.url, "a bomb").status_code == 400
              and router.metric("qlift_router_filter_reload_failures_total") == 1)
        for _ in range(3):
            assert chat(router.url, "a bomb").status_code == 400
        assert chat(router.url, "fine").status_code == 200
        assert router.metric("qlift_router_filter_reload_failures_total") == 1
        words.write_text("")
        _wait(lambda: chat(router.url, "a bomb").status_code == 400
              and router.metric("qlift_router_filter_reload_failures_total") == 2)
        assert chat(router.url, "a bomb").status_code == 400
        assert router.metric("qlift_router_filter_reload_failures_total") == 2
    log = (tmp_path / "router.log").read_text()
    assert log.count("not reloaded") == 2 and "Traceback" not in log


def test_slow_clients_and_the_connection_cap(tmp_path: Path) -> None:
    """60 half-sent requests against a cap of 50: 10 get 503 at once, the 50 get 408 after the
    header timeout, then a normal request works; the router's log stays a few lines long."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(1024, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))  # the router inherits a low soft limit...
    backend = TinyBackend("m").start()
    try:
        router = _router(tmp_path, backend, "server: {max_connections: 50, header_timeout_s: 2, body_timeout_s: 2}\n")
        router.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert router.proc is not None
        limits = Path(f"/proc/{router.proc.pid}/limits").read_text()
        line = next(ln for ln in limits.splitlines() if ln.startswith("Max open files"))
        assert line.split()[3] == line.split()[4] == str(hard)  # ... and raises it to the hard limit
        host, port = "127.0.0.1", int(router.url.rsplit(":", 1)[1])
        socks = []
        for _ in range(60):
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            socks.append(s)
            time.sleep(0.01)
        answers = [_read_all(s, 8) for s in socks]
        assert sum(a.startswith(b"HTTP/1.1 503") for a in answers) >= 10
        assert sum(a.startswith(b"HTTP/1.1 408") for a in answers) >= 45
        assert all(a.startswith((b"HTTP/1.1 503", b"HTTP/1.1 408")) for a in answers)
        for s in socks:
            s.close()
        assert chat(router.url).status_code == 200
        # A body that never finishes: 408 once body_timeout_s is over.
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"model\":")
        assert _read_all(s, 8).startswith(b"HTTP/1.1 408")
        s.close()
        assert router.metric("qlift_router_connections_refused_total") >= 10
        assert router.metric("qlift_router_client_timeouts_total", phase="header") >= 45
        assert router.metric("qlift_router_client_timeouts_total", phase="body") == 1
    finally:
        router.stop()
        backend.close()
    log = (tmp_path / "router.log").read_text()
    assert log.count("connection cap reached") == 1 and log.count("request headers took over") == 1, log
    assert "Traceback" not in log and len(log.splitlines()) < 15, log


def _read_all(s: socket.socket, timeout: float) -> bytes:
    s.settimeout(timeout)
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def test_credentials_in_backend_urls_are_used_and_never_shown(tmp_path: Path) -> None:
    with TinyBackend("m") as backend:
        url = backend.url.replace("http://", "http://alice:s3cretpw@")
        with _router(tmp_path, backend, url=url) as router:
            assert "s3cretpw" not in json.dumps(router.info)
            assert router.info["backends"][0]["url"] == backend.url.replace("http://", "http://***@")
            assert chat(router.url).status_code == 200  # parsed as one URL, not http://alice:s3cretpw
            state = httpclient.get(router.url + "/admin/state", headers={"Authorization": f"Bearer {TOKEN}"}).json()
            assert "s3cretpw" not in json.dumps(state)
    assert "s3cretpw" not in (tmp_path / "router.log").read_text()
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("backends: [{name: a, url: 'http://bob:hunter2@127.0.0.1 :1'}]\n")
    r = RouterProcess("--config", cfg, log_path=tmp_path / "bad.log")
    with pytest.raises(RuntimeError):
        r.start()
    text = (tmp_path / "bad.log").read_text()
    assert r.proc is not None and r.proc.returncode == 2 and "hunter2" not in text and "space" in text


def test_nested_json_bad_since_and_malformed_http_are_400s_in_one_line(tmp_path: Path) -> None:
    with TinyBackend("m") as backend, _router(tmp_path, backend) as router:
        for raw in (b"[" * 100_000, b'{"a":' * 5000 + b"1" + b"}" * 5000,
                    json.dumps({"model": "pub", "messages": [{"content": [[[[[[]]]]]] * 1}],
                                "x": json.loads("[" * 80 + "]" * 80)}).encode()):
            r = httpclient.post(router.url + "/v1/chat/completions", content=raw,
                           headers={"Content-Type": "application/json"}, timeout=30)
            assert r.status_code == 400 and ("JSON" in r.text or "nests deeper" in r.text), r.text
        admin = {"Authorization": f"Bearer {TOKEN}"}
        for since in ("1e26", str(10**26), "-" + "9" * 30, "abc", "1.5"):
            r = httpclient.get(router.url + "/admin/requests", params={"since": since}, headers=admin)
            assert r.status_code == 400, (since, r.text)
        assert httpclient.get(router.url + "/admin/requests", params={"since": "3"}, headers=admin).status_code == 200
        for route in ("/admin/weights", "/admin/shadow"):
            r = httpx.put(router.url + route, content=b"[" * 100_000, headers=admin)
            assert r.status_code == 400 and "nests deeper" in r.text, r.text
        port = int(router.url.rsplit(":", 1)[1])
        for raw in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
                    b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                    b"GET /\x00 HTTP/1.1\r\n\r\n") * 10:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(raw)
                assert _read_all(s, 5)[:12] in (b"HTTP/1.1 400", b"HTTP/1.0 400")
        assert chat(router.url).status_code == 200
    log = (tmp_path / "router.log").read_text()
    assert "Traceback" not in log
    assert sum("Error handling request" in line for line in log.splitlines()) <= 4, log


def test_bearer_scheme_is_case_insensitive_and_a_bare_token_is_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"key-one alice\nsha256:{hashlib.sha256(b'key-two').hexdigest()} bob  \n")
    with TinyBackend("m") as backend, _router(tmp_path, backend, f"api_keys_file: {keys.name}\n") as router:
        for scheme in ("Bearer", "bearer", "BEARER"):
            r = httpclient.get(router.url + "/admin/state", headers={"Authorization": f"{scheme} {TOKEN}"})
            assert r.status_code == 200, scheme
            assert chat(router.url, headers={"Authorization": f"{scheme}  key-one"}).status_code == 200
        assert httpclient.get(router.url + "/admin/state", headers={"Authorization": TOKEN}).status_code == 401
        basic = {"Authorization": f"Basic {TOKEN}"}
        assert httpclient.get(router.url + "/admin/state", headers=basic).status_code == 401
        assert chat(router.url, headers={"Authorization": "key-one"}).status_code == 401
        assert chat(router.url, headers={"Authorization": "bearer key-two"}).status_code == 200
    with TinyBackend("m") as backend, RouterProcess("--backend", f"a={backend.url}", "--public-model", "pub",
                                                    log_path=tmp_path / "ws.log", token=f"  {TOKEN}\n") as router:
        r = httpclient.get(router.url + "/admin/state", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200  # QLIFT_ROUTER_TOKEN's surrounding whitespace is stripped, as a client's is


def test_bad_router_inputs_are_clean_exits(tmp_path: Path, run_cli) -> None:
    def one_line(r, code: int, *words: str) -> None:  # type: ignore[no-untyped-def]
        assert r.exit_code == code, (r.exit_code, r.stderr)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
        for w in words:
            assert w in lines[0], (w, lines[0])

    backend = "backends: [{name: a, url: 'http://127.0.0.1:1'}]\n"
    cfg = tmp_path / "router.yaml"
    cfg.write_bytes(b"backends: [] # \xff\xfe latin-1 comment\n")
    one_line(run_cli("router", "--config", cfg), 2, str(cfg), "UTF-8")
    cfg.write_text(backend + "access_log: no/such/dir/access.jsonl\n")
    one_line(run_cli("router", "--config", cfg, "--port", "0"), 4, "access_log")
    assert not (tmp_path / "no").exists()
    cfg.write_text(backend + f"api_keys_file: {tmp_path}\n")
    one_line(run_cli("router", "--config", cfg, "--port", "0"), 2, "API keys")
    (tmp_path / "blocked.txt").write_bytes(b"bomb\n\xff\n")
    cfg.write_text(backend + "filter_file: blocked.txt\n")
    one_line(run_cli("router", "--config", cfg, "--port", "0"), 2, "blocked.txt", "UTF-8")
    one_line(run_cli("router", "--backend", "a=http://127.0.0.1 :9"), 2, "space")
    one_line(run_cli("router", "--backend", "a=http://user:pw@127.0.0.1:1", "--host", "no such host!", "--port", "0"),
             2, "--host")
    r = run_cli("router", "--backend", "a=http://user:pw@127.0.0.1 :1")
    one_line(r, 2)
    assert "pw" not in r.stderr


def test_a_password_with_a_hash_or_a_slash_is_never_shown(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    """Issue 29: a '#' in a password cut the URL there and the error printed the password (twice)."""
    secret = "Sup3rS3cret"
    flag = f"canary=http://admin:{secret}#2024@127.0.0.1:19002#m"
    r = run_cli("router", "--backend", flag, "--port", "0")
    assert r.exit_code == 2 and secret not in r.stderr and "%23" in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1
    cfg = tmp_path / "router.yaml"
    cfg.write_text(f"backends: [{{name: canary, url: 'http://admin:{secret}#2024@127.0.0.1:19002#m'}}]\n")
    r = run_cli("router", "--config", cfg, "--port", "0")
    assert r.exit_code == 2 and secret not in r.stderr and "%23" in r.stderr, r.stderr
    for url in (f"http://admin:{secret}/x@127.0.0.1:1", f"http://admin:{secret}@x@127.0.0.1:1"):
        r = run_cli("router", "--backend", f"a={url}", "--port", "0")
        assert r.exit_code == 2 and secret not in r.stderr and "S3cret" not in r.stderr, r.stderr
    assert redact_url(f"GET http://u:{secret}/#@h:1/x failed") == "GET http://***@h:1/x failed"


def test_legacy_model_after_credentials_is_parsed(tmp_path: Path) -> None:
    """`http://u:pw@host:port@MODEL` started the backend DOWN with no reason; it is URL@MODEL."""
    assert parse_backend_flag("c=http://u:pw@127.0.0.1:19002@smollm2-ft") == {
        "name": "c", "url": "http://u:pw@127.0.0.1:19002", "served_model": "smollm2-ft"}
    with TinyBackend("m") as backend:
        url = backend.url.replace("http://", "http://u:pw@") + "@m"
        with RouterProcess("--backend", f"only={url}", "--public-model", "pub", log_path=tmp_path / "r.log",
                           token=TOKEN) as router:
            assert router.info["backends"][0]["served_model"] == "m" and router.info["backends"][0]["healthy"]
            assert chat(router.url).status_code == 200


def test_metrics_need_the_admin_or_metrics_token_once_there_are_keys(tmp_path: Path) -> None:
    """Issue 29: with api_keys_file set, /metrics needed no key and showed customer key names with their
    filter hits. Now the admin token or metrics_token_file's token reads it; a client's own key does not."""
    keys = tmp_path / "keys.txt"
    keys.write_text("key-one alice\n")
    (tmp_path / "metrics.token").write_text("scrape-me\n")
    cfg = f"api_keys_file: {keys.name}\nmetrics_token_file: metrics.token\nfilter_file: blocked.txt\n"
    (tmp_path / "blocked.txt").write_text("bomb\n")
    with TinyBackend("m") as backend, _router(tmp_path, backend, cfg) as router:
        assert chat(router.url, "a bomb", headers={"Authorization": "Bearer key-one"}).status_code == 400
        for headers in ({}, {"Authorization": "Bearer key-one"}, {"Authorization": "Bearer wrong"}):
            r = httpclient.get(router.url + "/metrics", headers=headers)
            assert r.status_code == 401 and "alice" not in r.text and "metrics_token_file" in r.text, r.text
        for token in (TOKEN, "scrape-me"):
            r = httpclient.get(router.url + "/metrics", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200 and 'key="alice",reason="filter"' in r.text
    with TinyBackend("m") as backend, RouterProcess("--backend", f"a={backend.url}", "--public-model", "pub",
                                                    log_path=tmp_path / "open.log") as router:
        assert httpclient.get(router.url + "/metrics").status_code == 200  # an open router without a token: as before
    (tmp_path / "empty.token").write_text("\n")
    r = RouterProcess("--backend", "a=http://127.0.0.1:1", "--config", _write(tmp_path / "bad.yaml",
                      b"metrics_token_file: empty.token\n"), log_path=tmp_path / "bad.log")
    with pytest.raises(RuntimeError):
        r.start()
    assert r.proc is not None and r.proc.returncode == 2 and "metrics_token_file" in (tmp_path / "bad.log").read_text()
