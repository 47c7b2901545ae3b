"""The bake after 100% (`promote start --bake N`, then `promote finish`) through the real `qlift router` and the
real controller: a canary that turns bad only once it serves every user is rolled back to the stable (still
running at weight 0) within the bake; a healthy one bakes, is shown baking and baked by `status`, `--json`,
the report page and the metrics, and `promote finish` releases the stable. The backends are the adversarial
suite's scripted servers (what a real model won't do on demand) under its support-desk traffic.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from faults import RouterProcess, ScriptedBackend, metric_value
from test_promote_adversarial import BAD, DeckLoad, deck, stable

from qlift import httpclient
from qlift.errors import QliftError
from qlift.router.client import RouterClient
from qlift.vllm.process import free_port

TOKEN = "bake-token"


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)


class TurnsBadAt100:
    """A canary that answers as the stable until the router gives it every user, then as ``bad`` does."""

    def __init__(self, bad: Any) -> None:
        self.bad, self.turned = bad, threading.Event()
        self.bad_for_s: float | None = None  # from the turn to the router's weights back on the stable

    def __call__(self, body: dict[str, Any]) -> tuple[str, str]:
        return self.bad(body) if self.turned.is_set() else stable(body)

    @contextmanager
    def watching(self, router_url: str) -> Iterator[None]:
        done = threading.Event()

        def watch() -> None:
            client = RouterClient(router_url, TOKEN)
            turned_at = 0.0
            while not done.wait(0.05):
                try:
                    weight = client.state().weights.get("canary")
                except QliftError:  # a slow answer on a busy machine: read again
                    continue
                if weight == 100 and not self.turned.is_set():
                    self.turned.set()
                    turned_at = time.monotonic()
                elif weight == 0 and self.turned.is_set():
                    self.bad_for_s = time.monotonic() - turned_at
                    return

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        try:
            yield
        finally:
            if self.turned.is_set():  # the weights stay on the stable after a rollback: let it read them once more
                t.join(5)
            done.set()
            t.join(5)


class Failing(ScriptedBackend):
    """Answers 500 (an engine that died behind a live HTTP server) once ``failing`` is set."""

    def __init__(self, served_model: str, failing: threading.Event) -> None:
        super().__init__(served_model, stable)
        self.failing = failing

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if self.failing.is_set():
            self.requests += 1
            return web.json_response({"error": {"message": "engine dead", "type": "InternalServerError"}},
                                     status=500)
        return await super()._chat(request)


@contextmanager
def rollout_under_load(tmp_path: Path, canary: Any) -> Iterator[tuple[RouterProcess, DeckLoad]]:
    """``canary``: an answerer, or a backend not started yet."""
    backend = canary if isinstance(canary, ScriptedBackend) else ScriptedBackend("m-canary", canary)
    with ScriptedBackend("m-stable", stable) as s, backend as c, \
            RouterProcess("--backend", f"stable={s.url}@m-stable", "--backend", f"canary={c.url}@m-canary",
                          "--weight", "stable=100", "--weight", "canary=0", "--public-model", "pub",
                          log_path=tmp_path / "router.log", token=TOKEN) as router, \
            DeckLoad(router.url, deck(), per_thread_rps=30) as load:
        yield router, load


class Watcher:
    """Reads the rollout's metrics and `status` every 0.1 s while it runs: the (state, bake windows left) seen."""

    def __init__(self, journal: Path, port: int) -> None:
        self.journal, self.url = journal, f"http://127.0.0.1:{port}/metrics"
        self.metrics: set[tuple[str, int]] = set()
        self.status: set[tuple[str, int]] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        from qlift.errors import QliftError
        from qlift.rollout.api import status

        while not self._done.wait(0.1):
            try:
                samples = [s for f in text_string_to_metric_families(httpclient.get(self.url, timeout=2).text)
                           for s in f.samples]
                state = next(s.labels["state"] for s in samples if s.name == "qlift_rollout_info")
                left = next(int(s.value) for s in samples if s.name == "qlift_rollout_bake_windows_left")
                self.metrics.add((state, left))
            except (httpx.HTTPError, StopIteration):
                pass
            try:
                st = status(self.journal)
                if st["bake"] is not None:
                    self.status.add((st["state"], st["bake"]["left"]))
            except (QliftError, sqlite3.Error):  # the journal not created yet, or mid-write
                pass

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(5)


def start_args(router: RouterProcess, journal: Path, *extra: str) -> list[str]:
    return ["promote", "start", "--router", router.url, "--stable", "stable", "--canary", "canary",
            "--steps", "50,100", "--interval", "1s", "--min-requests", "10", "--journal", str(journal), "--json",
            *extra]


def _answer(url: str) -> str:
    body = {**deck()[0], "model": "pub", "max_tokens": 200}
    return str(httpclient.post(f"{url}/v1/chat/completions", json=body, timeout=30).json()["choices"][0]["message"]
               ["content"])


def test_healthy_canary_bakes_then_finish_releases_the_stable(run_cli: Any, tmp_path: Path) -> None:
    journal, port = tmp_path / "j.sqlite", free_port()
    with rollout_under_load(tmp_path, stable) as (router, load), Watcher(journal, port) as seen:
        r = run_cli(*start_args(router, journal, "--bake", "2", "--metrics-port", str(port)))
        weights = RouterClient(router.url, TOKEN).state().weights
    assert r.exit_code == 0, r.stderr[-2000:]
    assert not load.errors, load.errors[:3]
    st = json.loads(r.stdout)
    assert st["state"] == "baked" and weights == {"stable": 0, "canary": 100}  # the stable stays in the router
    bake = st["bake"]
    assert (bake["required"], bake["passed"], bake["left"]) == (2, 2, 0) and bake["phase"].startswith("passed")
    assert [w["action"] for w in bake["windows"]][-2:] == ["pass", "advance"]
    # judged against the stable's figures from the 50% step's last window: the stable served nobody at 100%
    kept = st["steps"][0]["windows"][-1]["stable"]["requests"]
    assert bake["baseline"]["requests"] == kept > 0
    assert all(w["stable"]["requests"] == kept and w["canary"]["requests"] >= 10 for w in bake["windows"])
    assert {c["name"] for c in bake["windows"][-1]["checks"]} >= {"error_rate", "latency", "near_repetition"}
    assert [s["outcome"] for s in st["steps"]] == ["passed", "promoted"]
    assert "`qlift promote finish`" in st["state_doc"]

    text = run_cli("promote", "status", "--journal", journal).stdout
    assert "bake at 100%: passed" in text and "2/2 window(s) passed" in text and "stable's kept figures" in text
    metrics = httpclient.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert metric_value(metrics, "qlift_rollout_info", state="baked") == 1
    assert metric_value(metrics, "qlift_rollout_bake_windows_total", action="advance") == 1
    assert "qlift_rollout_bake_windows_left{" in metrics
    assert metric_value(metrics, "qlift_rollout_bake_windows_left") == 0
    # while it baked: the state, the windows left counting down, in the metrics and in `status --json` alike
    assert {("baking", 2), ("baking", 1)} <= seen.metrics, seen.metrics
    assert {("baking", 2), ("baking", 1)} <= seen.status, seen.status
    page = tmp_path / "rollout.html"
    assert run_cli("promote", "report", "-o", page, "--journal", journal).exit_code == 0
    html = page.read_text()
    assert "<h2>Bake after 100%</h2>" in html and 'data-left="0"' in html and ">bake 2<" in html
    assert 'data-state="baked"' in html and 'class="bake-phase"' in html

    done = run_cli("promote", "finish", "--journal", journal, "--json")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "finished"
    assert json.loads(done.stdout)["decisions"][-1]["action"] == "finish"
    again = run_cli("promote", "finish", "--journal", journal)
    assert again.exit_code == 1 and "already finished" in again.stderr
    assert metric_value(httpclient.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text, "qlift_rollout_info",
                        state="finished") == 1


def test_canary_that_turns_bad_at_100_is_rolled_back_within_the_bake_with_no_user_error(run_cli: Any,
                                                                                          tmp_path: Path) -> None:
    journal = tmp_path / "j.sqlite"
    canary = TurnsBadAt100(BAD["reworded_loop"][0])
    with rollout_under_load(tmp_path, canary) as (router, load), canary.watching(router.url):
        r = run_cli(*start_args(router, journal, "--bake", "3"))
        weights = RouterClient(router.url, TOKEN).state().weights
        after = _answer(router.url)
    assert canary.turned.is_set()
    assert r.exit_code == 10, r.stderr[-2000:]
    st = json.loads(r.stdout)
    assert st["state"] == "rolled_back" and weights == {"stable": 100, "canary": 0}
    bake = st["bake"]
    assert bake["phase"].startswith("failed") and bake["windows"][-1]["action"] == "rollback"
    assert len(bake["windows"]) < 3  # within the bake, not after it
    failed = {c["name"] for c in bake["windows"][-1]["checks"] if c["status"] == "fail"}
    assert "near_repetition" in failed, (failed, st["reason"])
    # the 50% step passed the same canary: only the bake saw it go bad
    assert st["steps"][0]["outcome"] == "passed" and st["steps"][1]["outcome"] == "rolled_back"
    assert not load.errors, load.errors[:3]  # every client request answered, none an HTTP error
    assert after == stable(deck()[0])[0]  # the stable, which never stopped, answers again
    refused = run_cli("promote", "finish", "--journal", journal)
    assert refused.exit_code == 1 and "rolled_back" in refused.stderr and "nothing to finish" in refused.stderr


def test_canary_failing_at_100_reaches_users_only_until_the_early_rollback(run_cli: Any, tmp_path: Path) -> None:
    """What the router can and cannot hide at 100%: with the stable at weight 0 no backend is left to replay a
    failed request on, so users see the canary's 500s, until the bake window ends early on them and rolls back."""
    journal = tmp_path / "j.sqlite"
    watch = TurnsBadAt100(stable)
    with rollout_under_load(tmp_path, Failing("m-canary", watch.turned)) as (router, load), \
            watch.watching(router.url):
        r = run_cli(*start_args(router, journal, "--bake", "3", "--interval", "4s"))
        after = _answer(router.url)
    assert r.exit_code == 10, r.stderr[-2000:]
    st = json.loads(r.stdout)
    last = st["bake"]["windows"][-1]
    assert len(st["bake"]["windows"]) == 1 and last["action"] == "rollback" and "error_rate" in st["reason"]
    assert any("ended early" in n for n in last["notes"]), last["notes"]
    # users did read the 500s: from the turn to the rollback (1.5-1.7 s measured), inside the first 4 s window
    assert watch.bad_for_s is not None and watch.bad_for_s < 3.5, watch.bad_for_s
    assert load.errors and all(e.startswith("500 ") for e in load.errors), load.errors[:3]
    assert after == stable(deck()[0])[0]


def test_bake_needs_a_step_below_100(run_cli: Any, tmp_path: Path) -> None:
    r = run_cli("promote", "start", "--router", "http://127.0.0.1:9", "--stable", "a", "--canary", "b",
                "--steps", "100", "--bake", "2", "--journal", tmp_path / "j.sqlite")
    assert r.exit_code == 2 and "bake needs a step below 100" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr
    missing = run_cli("promote", "finish", "--journal", tmp_path / "none.sqlite")
    assert missing.exit_code == 4 and not (tmp_path / "none.sqlite").exists()
