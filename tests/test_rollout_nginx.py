"""nginx as the data plane, for real: rendered config, `nginx -t`, graceful reloads, the split,
stickiness and failover in front of two tiny OpenAI-shaped HTTP servers; the access-log
evidence; and a controller SIGKILLed again and again while it drives nginx."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from qlift import httpclient
from qlift.errors import BadInputError
from qlift.rollout.journal import Journal
from qlift.rollout.nginx import AccessLogSource, NginxDataPlane, render_nginx_conf
from qlift.rollout.spec import NginxSpec
from qlift.vllm.process import free_port

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
needs_nginx = pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed (apt-get install nginx)")


class TinyOpenAI:
    """A small real HTTP server with the OpenAI chat shape, in a thread: fixed answers, settable faults."""

    def __init__(self, name: str, *, tokens: int = 5, delay_s: float = 0.0) -> None:
        self.name, self.tokens, self.delay_s = name, tokens, delay_s
        self.fail_status: int | None = None
        self.seen = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.seen += 1
        body = await request.json()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_status:
            return web.json_response({"error": {"message": "down", "type": "test", "code": self.fail_status}},
                                     status=self.fail_status)
        usage = {"prompt_tokens": 3, "completion_tokens": self.tokens, "total_tokens": 3 + self.tokens}
        if not body.get("stream"):
            return web.json_response({"id": "x", "object": "chat.completion", "model": self.name, "usage": usage,
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": "hi " * self.tokens}}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(self.tokens):
            delta = {"content": "hi "} if i else {"role": "assistant", "content": "hi "}
            chunk = {"id": "x", "model": self.name, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        final = {"id": "x", "model": self.name, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await resp.write(f"data: {json.dumps(final)}\n\n".encode())
        await resp.write(f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name, "object": "model", "root": None}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def __enter__(self) -> TinyOpenAI:
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        assert ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.fixture
def two_backends() -> Iterator[tuple[TinyOpenAI, TinyOpenAI]]:
    with TinyOpenAI("stable", tokens=5) as s, TinyOpenAI("canary", tokens=5) as c:
        yield s, c


@pytest.fixture
def nginx_plane(tmp_path: Path, two_backends: tuple[TinyOpenAI, TinyOpenAI]) -> Iterator[NginxDataPlane]:
    s, c = two_backends
    spec = NginxSpec(prefix=tmp_path / "nginx", listen=f"127.0.0.1:{free_port()}", binary=NGINX)
    plane = NginxDataPlane(spec, {"stable": s.url, "canary": c.url})
    yield plane
    plane.stop()


def _chat(url: str, session: str | None = None, stream: bool = False) -> httpx.Response:
    headers = {"X-Session-Id": session} if session else {}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": stream}
    return httpclient.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=10)


def test_render_checks_with_nginx_t(tmp_path: Path) -> None:
    spec = NginxSpec(prefix=tmp_path, listen="127.0.0.1:18080", binary=NGINX)
    conf = render_nginx_conf(spec, {"stable": "http://127.0.0.1:8001", "canary": "http://127.0.0.1:8002"},
                             {"stable": 90, "canary": 10})
    assert "10% qlift_canary;" in conf and "* qlift_stable;" in conf and "proxy_buffering off;" in conf
    assert "server 127.0.0.1:8001 max_fails=0 backup;" in conf  # stable backs up the canary
    (tmp_path / "logs").mkdir()
    (tmp_path / "tmp").mkdir()
    (tmp_path / "nginx.conf").write_text(conf)
    if Path(NGINX).exists():
        out = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr


def test_a_version_named_by_model_on_a_shared_server_is_refused(tmp_path: Path) -> None:
    spec = NginxSpec(prefix=tmp_path, listen="127.0.0.1:18080", binary=NGINX)
    with pytest.raises(BadInputError, match="splits traffic by server only"):
        render_nginx_conf(spec, {"stable": "http://127.0.0.1:8001#base", "canary": "http://127.0.0.1:8001#tickets"},
                          {"stable": 90, "canary": 10})


def test_a_client_is_not_told_which_version_answered_unless_the_spec_says_so(tmp_path: Path) -> None:
    backends = {"stable": "http://127.0.0.1:8001", "canary": "http://127.0.0.1:8002"}
    spec = NginxSpec(prefix=tmp_path, listen="127.0.0.1:18080", binary=NGINX)
    assert "X-Qlift-Backend" not in render_nginx_conf(spec, backends, {"stable": 90, "canary": 10})
    shown = spec.model_copy(update={"expose_backend_header": True})
    assert "add_header X-Qlift-Backend $upstream_addr always;" in render_nginx_conf(shown, backends,
                                                                                   {"stable": 90, "canary": 10})


def test_weights_are_read_from_the_split_block_so_a_hand_edit_is_drift(tmp_path: Path) -> None:
    backends = {"stable": "http://127.0.0.1:8001", "canary": "http://127.0.0.1:8002"}
    plane = NginxDataPlane(NginxSpec(prefix=tmp_path, listen="127.0.0.1:18080", binary=NGINX), backends)
    assert plane.weights() is None  # no config yet
    conf = render_nginx_conf(plane.spec, backends, {"stable": 90, "canary": 10})
    plane.conf.write_text(conf)
    assert plane.weights() == {"stable": 90, "canary": 10}
    plane.conf.write_text(conf.replace("10% qlift_canary;", "0% qlift_canary;"))  # an operator's edit
    assert plane.weights() == {"stable": 100, "canary": 0}
    plane.conf.write_text(conf.replace("10% qlift_canary;", "35% qlift_canary;"))
    assert plane.weights() == {"stable": 65, "canary": 35}


@needs_nginx
def test_split_stickiness_failover_and_graceful_reload(nginx_plane: NginxDataPlane,
                                                       two_backends: tuple[TinyOpenAI, TinyOpenAI]) -> None:
    s, c = two_backends
    url = f"http://{nginx_plane.spec.listen}"
    nginx_plane.set_weights({"stable": 70, "canary": 30})
    assert nginx_plane.weights() == {"stable": 70, "canary": 30} and nginx_plane.running_pid()
    logs = AccessLogSource(nginx_plane.prefix, nginx_plane.backends)
    logs.begin()
    models = Counter(_chat(url).json()["model"] for _ in range(400))
    assert abs(100 * models["canary"] / 400 - 30) <= 7, models
    # A session key always lands on the same version.
    for key in ("alice", "bob", "carol"):
        assert len({_chat(url, session=key).json()["model"] for _ in range(20)}) == 1
    # The canary fails: each failure is replayed on the stable, so clients see none; the log blames the canary.
    c.fail_status = 500
    answers = [_chat(url, stream=True) for _ in range(100)]
    assert all(r.status_code == 200 for r in answers) and all(b"[DONE]" in r.content for r in answers)
    # nginx writes a line after its response: wait for all 560 (400 split, 60 sessions, 100 failover) before counting
    deadline = time.monotonic() + 5
    while len(logs.lines) < 560 and time.monotonic() < deadline:
        logs.peek()
        time.sleep(0.05)
    ev = logs.collect()
    assert ev["canary"].errors and ev["canary"].errors >= 15 and ev["stable"].errors == 0
    # Every one of the 100 failover requests ended on the stable, on top of its share of the split.
    assert ev["stable"].requests >= models["stable"] + 100, (ev["stable"].requests, models)
    # TTFT from the 100 streamed answers only (the last log line may still be unwritten), not the 400 others
    assert 95 <= len(ev["stable"].ttft_s) <= 100 < len(ev["stable"].latency_s)
    # A graceful reload to 100/0 under traffic drops nothing.
    c.fail_status = None
    pid = nginx_plane.running_pid()
    stop = threading.Event()
    statuses: Counter[int] = Counter()

    def load() -> None:
        while not stop.is_set():
            statuses[_chat(url).status_code] += 1

    t = threading.Thread(target=load)
    t.start()
    time.sleep(0.3)
    nginx_plane.set_weights({"stable": 100, "canary": 0})
    time.sleep(0.5)
    stop.set()
    t.join(10)
    assert set(statuses) == {200} and nginx_plane.running_pid() == pid
    time.sleep(0.3)  # old workers finish; new requests see the new split
    assert {_chat(url).json()["model"] for _ in range(50)} == {"stable"}


@needs_nginx
def test_nginx_t_refusal_keeps_the_running_config(nginx_plane: NginxDataPlane) -> None:
    nginx_plane.set_weights({"stable": 90, "canary": 10})
    before = nginx_plane.conf.read_text()
    nginx_plane.spec = nginx_plane.spec.model_copy(update={"session_key": "$http_x_session_id bad;"})
    from qlift.errors import ExternalToolError

    with pytest.raises(ExternalToolError, match="nginx -t"):
        nginx_plane.set_weights({"stable": 50, "canary": 50})
    assert nginx_plane.conf.read_text() == before


# -- the journal under SIGKILL ------------------------------------------------------------


def _spec_file(tmp_path: Path, s: TinyOpenAI, c: TinyOpenAI, listen: str, steps: list[int]) -> Path:
    f = tmp_path / "rollout.yaml"
    f.write_text(json.dumps({
        "stable": "stable", "canary": "canary", "data_plane": "nginx", "steps": steps, "interval": "1s",
        "backends": {"stable": s.url, "canary": c.url}, "vllm_metrics": False,
        "nginx": {"prefix": str(tmp_path / "nginx"), "listen": listen, "binary": NGINX},
        "analysis": {"min_requests": 3, "max_inconclusive": 20},
    }))
    return f


def _start(spec_file: Path, journal: Path, *, resume: bool = False) -> subprocess.Popen[bytes]:
    args = ["resume"] if resume else ["start", "-f", str(spec_file)]
    return subprocess.Popen([sys.executable, "-m", "qlift", "promote", *args, "--journal", str(journal)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _journal_knows_the_weights(journal_path: Path, plane: NginxDataPlane) -> dict[str, Any]:
    with Journal(journal_path) as j:
        r = j.latest()
        if r is None:
            return {}
        changes = j.history(r.id)["weight_changes"]
        actual = plane.weights()
        known = [c["weights"] for c in changes if c["applied_at"]]
        pending = [c["weights"] for c in changes if not c["applied_at"]]
        assert len(pending) <= 1 and (not pending or changes[-1]["applied_at"] is None), changes
        # nginx holds either the last applied weights or the one journaled intent in flight.
        allowed = ([known[-1]] if known else []) + pending
        assert actual is None and not known or actual in allowed, (actual, changes)
        return {"step": r.step, "state": r.state, "changes": changes}


@needs_nginx
def test_sigkill_at_any_point_resumes_at_the_recorded_step(tmp_path: Path,
                                                           two_backends: tuple[TinyOpenAI, TinyOpenAI]) -> None:
    from faults import BackgroundLoad

    s, c = two_backends
    s.delay_s = c.delay_s = 0.01  # ~100 requests/s at concurrency 2: bounded
    listen = f"127.0.0.1:{free_port()}"
    spec_file = _spec_file(tmp_path, s, c, listen, [10, 25, 50, 75, 100])
    journal = tmp_path / "journal.sqlite"
    plane = NginxDataPlane(NginxSpec(prefix=tmp_path / "nginx", listen=listen, binary=NGINX),
                           {"stable": s.url, "canary": c.url})
    rng = random.Random(7)
    kills = 0
    try:
        proc = _start(spec_file, journal)
        deadline = time.monotonic() + 10
        while plane.running_pid() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        # Connection: close -- a graceful reload closes idle keep-alive connections, and a client that
        # reuses one at that instant gets a connection error (nginx behaviour; see docs/promote.md).
        with BackgroundLoad(f"http://{listen}", "", concurrency=2, stream=False, max_tokens=8, timeout_s=90,
                            headers={"Connection": "close"}) as load:
            steps_seen = []
            for attempt in range(6):
                time.sleep(rng.uniform(0.2, 1.6))
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
                kills += 1
                state = _journal_knows_the_weights(journal, plane)
                steps_seen.append(state["step"])
                if state["state"] != "progressing":
                    break
                proc = _start(spec_file, journal, resume=attempt % 2 == 1)  # `start` and `resume` both continue
            assert proc.wait(60) == 0 or state["state"] == "promoted", proc.stderr.read() if proc.stderr else ""
        result = load.result
    finally:
        if proc.poll() is None:
            proc.kill()
        plane.stop()
    final = _journal_knows_the_weights(journal, plane)
    assert final["state"] == "promoted" and kills >= 3
    canary_weights = [ch["weights"]["canary"] for ch in final["changes"]]
    assert canary_weights == sorted(canary_weights), canary_weights  # never restarted from an earlier step
    assert canary_weights[-1] == 100 and all(ch["applied_at"] for ch in final["changes"])
    assert steps_seen == sorted(steps_seen)
    assert result.errors == 0, result.error_messages[:3]
    with Journal(journal) as j:
        h = j.history(1)
    advanced = [d["step"] for d in h["decisions"] if d["action"] == "advance"]
    assert advanced == sorted(set(advanced)) == [0, 1, 2, 3]  # each step advanced exactly once
