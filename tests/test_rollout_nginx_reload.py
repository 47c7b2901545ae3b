"""nginx reloads during a rollout, for real: weight changes while slow LLM-style streams are in flight
must lose no answer, and an answer a reload still cuts must reach the judge as an error."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from faults import BackgroundLoad, TinyBackend

from qlift.rollout.nginx import AccessLogSource, NginxDataPlane, render_nginx_conf
from qlift.rollout.spec import NginxSpec
from qlift.vllm.process import free_port

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
pytestmark = pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed (apt-get install nginx)")


@pytest.fixture
def slow_backends() -> Iterator[tuple[TinyBackend, TinyBackend]]:
    """Both versions stream 30 chunks 0.1 s apart (3 s an answer), like a small model on a busy CPU."""
    with TinyBackend("m", tokens=30, chunk_delay_s=0.1) as s, TinyBackend("m", tokens=30, chunk_delay_s=0.1) as c:
        yield s, c


def _plane(tmp_path: Path, s: TinyBackend, c: TinyBackend, **spec: object) -> NginxDataPlane:
    nspec = NginxSpec.model_validate({"prefix": tmp_path / "nginx", "listen": f"127.0.0.1:{free_port()}",
                                      "binary": NGINX, **spec})
    return NginxDataPlane(nspec, {"stable": s.url, "canary": c.url})


def test_rendered_reload_settings(tmp_path: Path) -> None:
    spec = NginxSpec(prefix=tmp_path, max_answer_s="15m")  # type: ignore[arg-type]
    conf = render_nginx_conf(spec, {"s": "http://127.0.0.1:1", "c": "http://127.0.0.1:2"}, {"s": 90, "c": 10})
    assert "worker_shutdown_timeout 900s;" in conf and "proxy_read_timeout 900s;" in conf
    assert "keepalive_timeout 0;" in conf
    kept = render_nginx_conf(NginxSpec(prefix=tmp_path, client_keepalive_s=30), {"s": "http://127.0.0.1:1"},
                             {"s": 100})
    assert "keepalive_timeout 30s;" in kept


@pytest.mark.parametrize("stream", [True, False])
def test_reloads_mid_stream_lose_no_answer(tmp_path: Path, slow_backends: tuple[TinyBackend, TinyBackend],
                                           stream: bool) -> None:
    """Six weight changes (six reloads) under eight clients that keep connections alive (aiohttp's pool):
    before, 40 of 88 streamed requests died ('Can not write request body') and none was in nginx's log."""
    s, c = slow_backends
    plane = _plane(tmp_path, s, c)
    plane.set_weights({"stable": 90, "canary": 10})
    source = AccessLogSource(plane.prefix, {"stable": s.url, "canary": c.url})
    source.begin()
    url = f"http://127.0.0.1:{plane.spec.listen.rsplit(':', 1)[1]}"
    try:
        with BackgroundLoad(url, "m", concurrency=8, stream=stream, timeout_s=60) as load:
            for k in range(6):
                time.sleep(1.5)  # mid-stream: every request in flight is 0-3 s into its answer
                plane.set_weights({"stable": 50 if k % 2 == 0 else 90, "canary": 50 if k % 2 == 0 else 10})
            time.sleep(0.5)
            result = load.stop()
        deadline = time.monotonic() + 10  # nginx writes a line once the answer is done: wait for the last ones
        while time.monotonic() < deadline and sum(v.requests for v in source.peek().values()) < result.ok:
            time.sleep(0.2)
    finally:
        plane.stop()
    assert result.errors == 0, (result.statuses, result.error_messages[:3])
    assert result.ok >= 24
    ev = source.collect()
    assert ev["stable"].requests + ev["canary"].requests == result.ok
    assert ev["stable"].errors == 0 and ev["canary"].errors == 0
    # TTFT is the first byte of a stream only: a non-streamed answer's first byte is all of it
    assert (len(ev["stable"].ttft_s) > 0) == stream and (len(ev["canary"].ttft_s) > 0) == stream


def test_an_answer_a_reload_cuts_is_an_error_of_its_version(tmp_path: Path,
                                                            slow_backends: tuple[TinyBackend, TinyBackend]) -> None:
    """Old workers keep an answer for max_answer_s; one longer than that is cut at the reload, and the
    access log evidence counts it against the version that was answering."""
    s, c = slow_backends
    plane = _plane(tmp_path, s, c, max_answer_s=1)
    plane.set_weights({"stable": 0, "canary": 100})
    source = AccessLogSource(plane.prefix, {"stable": s.url, "canary": c.url})
    source.begin()
    url = f"http://127.0.0.1:{plane.spec.listen.rsplit(':', 1)[1]}"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    cut = False
    try:
        with httpx.Client(timeout=30) as client, client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            chunks = r.iter_bytes()
            next(chunks)
            plane.set_weights({"stable": 100, "canary": 0})
            try:
                data = b"".join(chunks)
            except httpx.HTTPError:
                cut = True
            else:
                cut = b"[DONE]" not in data
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not source.peek()["canary"].requests:
            time.sleep(0.2)
    finally:
        plane.stop()
    assert cut  # the client did not get the whole answer
    ev = source.collect()
    assert (ev["canary"].requests, ev["canary"].errors) == (1, 1)
    assert ev["stable"].requests == 0


def test_a_client_that_goes_away_mid_stream_is_nobodys_error(tmp_path: Path,
                                                            slow_backends: tuple[TinyBackend, TinyBackend]) -> None:
    """nginx logs an abandoned stream like a cut one (200, request_completion empty); without a reload
    behind it, it counts for no version (as a 499 does)."""
    s, c = slow_backends
    plane = _plane(tmp_path, s, c)
    plane.set_weights({"stable": 0, "canary": 100})
    source = AccessLogSource(plane.prefix, {"stable": s.url, "canary": c.url})
    source.begin()
    url = f"http://127.0.0.1:{plane.spec.listen.rsplit(':', 1)[1]}"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    try:
        with httpx.Client(timeout=30) as client:
            with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                next(r.iter_bytes())  # leave after the first chunk
            assert client.post(url + "/v1/chat/completions", json={**body, "stream": False}).status_code == 200
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and source.peek()["canary"].requests < 1:
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        plane.stop()
    ev = source.collect()
    assert (ev["canary"].requests, ev["canary"].errors) == (1, 0)
