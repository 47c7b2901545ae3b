"""A router restart without an outage: `qlift router --take-over` starts a new process on the port of the one
running, which hands over its listening socket and admin-set state, then drains and exits. Driven with the
OpenAI SDK (no retries, so a single refused or reset connection counts) against small real backends."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from aiohttp import web
from faults import RouterProcess, SdkLoad, ThreadedApp, TinyBackend, until

from qlift.router.client import HANDOVER_HEADER, RouterClient
from qlift.vllm.process import free_port

TOKEN = "restart-admin-token"


def _router(port: int, stable: TinyBackend, canary: TinyBackend, tmp_path: Path, *extra: str) -> RouterProcess:
    return RouterProcess("--backend", f"stable={stable.url}#tiny", "--backend", f"canary={canary.url}#tiny",
                         "--public-model", "pub", "--port", str(port), *extra, token=TOKEN,
                         log_path=tmp_path / "router.log")


@pytest.fixture
def backends() -> tuple[TinyBackend, TinyBackend]:
    # Streams of 8 chunks 10 ms apart: some are always in flight when the router hands over.
    with TinyBackend("tiny", tokens=8, chunk_delay_s=0.01) as stable, \
            TinyBackend("tiny", tokens=8, chunk_delay_s=0.01) as canary:
        yield stable, canary


def test_take_over_under_sdk_load_fails_no_request_and_keeps_the_weights(tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]
    stable, canary = backends
    port = free_port()
    old = _router(port, stable, canary, tmp_path).start()
    new: RouterProcess | None = None
    try:
        old.admin().set_weights({"stable": 20, "canary": 80})
        old.admin().set_shadow("canary", 10, partner="stable")
        load = SdkLoad(old.url, max_tokens=8, threads=3, check=lambda text: text.startswith("hi ")).start()
        until(lambda: load.ok >= 50, 10, "load to get going")
        new = _router(port, stable, canary, tmp_path, "--take-over").start()
        assert new.url == old.url and new.info["took_over_from"] == old.proc.pid  # type: ignore[union-attr]
        assert old.proc is not None and old.proc.wait(15) == 0  # drained and gone
        served_before = load.ok
        until(lambda: load.ok >= served_before + 100, 10, "load to go on through the new process")
        load.stop()
        assert not load.failures, f"{sum(load.failures.values())} of {load.ok} failed: {dict(load.failures)}"
        state = new.admin().state()
        assert state.weights == {"stable": 20, "canary": 80}
        assert state.shadow is not None and (state.shadow.version, state.shadow.percent, state.shadow.partner) == \
            ("canary", 10, "stable")
        assert state.seq > 0  # the new process answered requests itself
        log = old.log_tail(200)
        assert f"handed the listening socket over to pid {new.proc.pid}" in log  # type: ignore[union-attr]
        assert TOKEN not in log
    finally:
        if new is not None:
            new.stop()
        old.stop()


def test_a_take_over_that_fails_leaves_the_old_router_serving(tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]
    stable, canary = backends
    port = free_port()
    with _router(port, stable, canary, tmp_path) as old:
        old.admin().set_weights({"stable": 0, "canary": 100})
        # Backends that do not match the running router's: its weights cannot be carried, so no take-over.
        other = RouterProcess("--backend", f"blue={stable.url}#tiny", "--port", str(port), "--take-over", "--json",
                              token=TOKEN, log_path=tmp_path / "other.log")
        with pytest.raises(RuntimeError, match="router did not start"):
            other.start()
        assert "canary" in other.log_tail() and "left running" in other.log_tail()
        assert old.proc is not None and old.proc.poll() is None
        assert old.admin().set_weights({"stable": 50, "canary": 50}).weights == {"stable": 50, "canary": 50}
        reply = openai.OpenAI(base_url=old.url + "/v1", api_key="none", max_retries=0).chat.completions.create(
            model="pub", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert reply.choices[0].message.content


class HandingOver(ThreadedApp):
    """An admin endpoint that answers like a router handing over for its first ``busy`` calls."""

    def __init__(self, busy: int) -> None:
        self.busy, self.calls = busy, 0
        super().__init__()

    async def _weights(self, request: web.Request) -> web.Response:
        self.calls += 1
        if self.calls <= self.busy:
            return web.json_response({"error": {"message": "handing over", "type": "service_unavailable"}},
                                     status=503, headers={HANDOVER_HEADER: "1234"})
        return web.json_response({"public_model": "pub", "weights": {"a": 100}, "backends": [],
                                  "started_at": "2025-01-01T00:00:00+00:00", "seq": 0})

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_put("/admin/weights", self._weights)
        return app


def test_the_admin_client_retries_a_write_the_old_router_holds_during_a_take_over() -> None:
    with HandingOver(busy=2) as server:
        assert RouterClient(server.url, "t").set_weights({"a": 100}).weights == {"a": 100}
        assert server.calls == 3


def test_take_over_with_no_router_running_starts_fresh(tmp_path: Path, backends) -> None:  # type: ignore[no-untyped-def]
    stable, canary = backends
    with _router(free_port(), stable, canary, tmp_path, "--take-over") as router:
        assert router.info["took_over_from"] is None
        assert router.admin().state().weights == {"stable": 50, "canary": 50}
