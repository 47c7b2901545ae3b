"""The router's backends as live objects: added, re-pointed, retired and re-resolved through the admin API
(RouterClient) while traffic flows; a backend whose server comes back serving another model is re-resolved
(unpinned) or named down in one line (pinned); the changes survive a router restart (state file)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from faults import BackgroundLoad, RouterProcess
from router_backends import ScriptedBackend

from qlift.errors import ExternalToolError, IncompatibleError, NotFoundError
from qlift.router.balancer import Backend
from qlift.router.config import BackendConfig
from qlift.router.state import SavedState
from qlift.vllm.process import free_port

TOKEN = "admin-secret"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}  # so each answer names its backend (X-Qlift-Backend)


def _config(tmp_path: Path, backends: str) -> Path:
    """A router.yaml with fast health checks (a restarted server is noticed in well under a second)."""
    cfg = tmp_path / "router.yaml"
    cfg.write_text(f"public_model: pub\nhealth: {{interval_s: 0.1, timeout_s: 1, failures: 1}}\nbackends:\n{backends}")
    return cfg


def _until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_add_repoint_and_retire_while_traffic_flows_with_no_failed_request(tmp_path: Path) -> None:
    with ScriptedBackend("m-v1") as v1, ScriptedBackend("m-v2") as v2, ScriptedBackend("m-v3") as v3, \
            RouterProcess("--config", _config(tmp_path, f"  - {{name: stable, url: '{v1.url}'}}\n"),
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        admin = router.admin()
        with BackgroundLoad(router.url, "pub", concurrency=2, stream=False, headers=ADMIN) as load:
            added = admin.add_backend("next", v2.url, "m-v2")
            assert (added.change, added.pinned) == ("added", True)
            assert added.backend_state().healthy and added.state.weights == {"stable": 100, "next": 0}
            assert "added backend next at" in added.message and "'m-v2' (pinned), weight 0" in added.message
            with pytest.raises(IncompatibleError, match="backend 'next' exists"):
                admin.add_backend("next", v3.url)

            admin.set_weights({"stable": 50, "next": 50})
            _until(lambda: load.result.backends["next"] >= 5)
            moved = admin.repoint_backend("next", url=v3.url + "#m-v3")
            assert moved.change == "repointed" and moved.backend_state().served_model == "m-v3"
            assert moved.backend_state().weight == 50 and moved.backend_state().healthy
            served_v3 = len(v3.bodies)
            _until(lambda: len(v3.bodies) >= served_v3 + 5)
            assert {b["model"] for b in v3.bodies} == {"m-v3"}

            with pytest.raises(IncompatibleError, match="backend stable has weight 50: move it"):
                admin.retire_backend("stable")
            admin.set_weights({"next": 100})
            retired = admin.retire_backend("stable")
            assert retired.change == "retired" and retired.pinned is None
            assert retired.state.weights == {"next": 100} and [b.name for b in retired.state.backends] == ["next"]
            with pytest.raises(NotFoundError, match="no backend 'stable'; known: next"):
                admin.retire_backend("stable")
            served = load.result.ok
            _until(lambda: load.result.ok >= served + 10)
        result = load.result
        assert result.errors == 0 and result.ok > 20, result.error_messages[:3]
        assert TOKEN not in (tmp_path / "router.log").read_text()


def test_a_stream_on_a_backend_retired_under_it_ends_whole_and_is_logged_as_sent(tmp_path: Path) -> None:
    """A request that chose a backend keeps it until it ends: retired meanwhile, the stream still ends with [DONE],
    and its access-log line names the model it was sent as. (The log line looked the backend up by name after the
    answer: KeyError, and the client's connection was reset, 1 request in 323 of the test above.)"""
    import httpx

    log = tmp_path / "router.log"
    with ScriptedBackend("m-v1", tokens=8, chunk_delay_s=0.25) as v1, ScriptedBackend("m-v2") as v2, \
            RouterProcess("--config", _config(tmp_path, f"  - {{name: stable, url: '{v1.url}'}}\n"
                                                        f"  - {{name: next, url: '{v2.url}'}}\n"),
                          log_path=log, token=TOKEN) as router:
        admin = router.admin()
        admin.set_weights({"stable": 100, "next": 0})
        with httpx.Client(timeout=30) as client, client.stream(
                "POST", f"{router.url}/v1/chat/completions", headers=ADMIN,
                json={"model": "pub", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
            lines = r.iter_lines()
            first = next(ln for ln in lines if ln.startswith("data: {"))  # under way on stable
            admin.set_weights({"next": 100})
            assert admin.retire_backend("stable").change == "retired"
            rest = [ln for ln in lines if ln]
        assert r.status_code == 200 and r.headers.get("X-Qlift-Backend") == "stable"
        assert json.loads(first[6:])["model"] == "pub" and rest[-1] == "data: [DONE]", rest[-3:]
    text = log.read_text()
    assert "Error handling request" not in text, text[-2000:]
    logged = [json.loads(ln) for ln in text.splitlines() if ln.startswith('{"time"')]
    assert [(x["backend"], x["served_model"], x["status"]) for x in logged] == [("stable", "m-v1", 200)], logged


def test_a_server_back_under_another_model_is_re_resolved_unpinned_and_named_down_pinned(tmp_path: Path) -> None:
    old, pinned_old = ScriptedBackend("m-v1").start(), ScriptedBackend("m-pin").start()
    log = tmp_path / "router.log"
    try:
        with ScriptedBackend("m-live") as live, RouterProcess("--config", _config(tmp_path, (
                f"  - {{name: live, url: '{live.url}', weight: 100}}\n"
                f"  - {{name: stable, url: '{old.url}', weight: 0}}\n"
                f"  - {{name: canary, url: '{pinned_old.url}#m-pin', weight: 0}}\n")),
                log_path=log, token=TOKEN) as router:
            admin = router.admin()
            assert admin.state().backend("stable").served_model == "m-v1"
            with BackgroundLoad(router.url, "pub", concurrency=1, stream=False, headers=ADMIN) as load:
                # The role swap of docs/promote.md: the next version on the freed port, under its own name.
                old.close(), pinned_old.close()
                _until(lambda: not admin.state().backend("stable").healthy)
                with ScriptedBackend("m-v2", port=old.port) as new, ScriptedBackend("m-v3", port=pinned_old.port):
                    _until(lambda: admin.state().backend("stable").served_model == "m-v2")
                    assert admin.state().backend("stable").healthy
                    admin.set_weights({"live": 50, "stable": 50})
                    _until(lambda: len(new.bodies) >= 3)
                    assert {b["model"] for b in new.bodies} == {"m-v2"}
                    _until(lambda: admin.state().backend("canary").problem is not None)
                    canary = admin.state().backend("canary")
                    assert not canary.healthy and canary.served_model == "m-pin"
                    assert "model 'm-pin' is not listed at /v1/models (it lists m-v3)" in (canary.problem or "")
                    assert 'PUT /admin/backends/canary {"model": "m-v3"}' in (canary.problem or "")
                    with pytest.raises(IncompatibleError, match=r'"pin": true'):
                        admin.resolve_backend("canary")
                    taken = admin.resolve_backend("canary", pin=True)
                    assert (taken.change, taken.pinned) == ("resolved", True)
                    assert taken.backend_state().served_model == "m-v3" and taken.backend_state().healthy
                    assert admin.resolve_backend("stable").change == "unchanged"
                    load.stop()
            assert load.result.errors == 0 and load.result.ok > 0, load.result.error_messages[:3]
        lines = log.read_text().splitlines()
        assert sum("now serves 'm-v2', no longer 'm-v1'" in line for line in lines) == 1
        assert sum("'m-pin' is not listed" in line for line in lines) == 1
    finally:
        old.close(), pinned_old.close()


def test_a_server_that_does_not_answer_is_added_out_of_rotation_and_not_re_resolved(tmp_path: Path) -> None:
    with ScriptedBackend("m-v1") as v1, RouterProcess(
            "--config", _config(tmp_path, f"  - {{name: stable, url: '{v1.url}'}}\n"),
            log_path=tmp_path / "router.log", token=TOKEN) as router:
        admin = router.admin()
        added = admin.add_backend("spare", f"http://127.0.0.1:{free_port()}")
        assert not added.backend_state().healthy and "out of rotation until its server answers" in added.message
        with pytest.raises(ExternalToolError, match="does not answer /health and /v1/models: nothing re-resolved"):
            admin.resolve_backend("spare")
        with pytest.raises(NotFoundError, match="no backend 'nope'"):
            admin.repoint_backend("nope", url=v1.url)


def test_live_backends_come_back_after_a_restart_unless_the_config_changed(tmp_path: Path) -> None:
    with ScriptedBackend("m-v1") as v1, ScriptedBackend("m-v2") as v2:
        cfg = _config(tmp_path, f"  - {{name: stable, url: '{v1.url}'}}\n")
        with RouterProcess("--config", cfg, log_path=tmp_path / "r1.log", token=TOKEN) as router:
            admin = router.admin()
            admin.add_backend("next", v2.url)
            admin.set_weights({"stable": 0, "next": 100})
            admin.retire_backend("stable")
        saved = json.loads(cfg.with_suffix(".state.json").read_text())
        assert [b["name"] for b in saved["backends"]] == ["next"] and saved["backends"][0]["served_model"] is None
        with RouterProcess("--config", cfg, log_path=tmp_path / "r2.log", token=TOKEN) as router:
            state = router.admin().state()
            assert state.weights == {"next": 100} and state.backend("next").served_model == "m-v2"
        cfg.write_text(cfg.read_text().replace(v1.url, v2.url))  # the operator re-pointed it in the file
        with RouterProcess("--config", cfg, log_path=tmp_path / "r3.log", token=TOKEN) as router:
            assert router.admin().state().weights == {"stable": 100}
        assert "the configured backends changed since; the configuration wins" in (tmp_path / "r3.log").read_text()


def test_a_state_file_without_live_changes_reads_as_before(tmp_path: Path) -> None:
    configured = [BackendConfig(name="stable", url="http://127.0.0.1:1"),
                  BackendConfig(name="canary", url="http://127.0.0.1:2", served_model="m")]
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"weights": {"stable": 10, "canary": 90}, "shadow": None}))  # an older file
    assert SavedState(path).load(configured).weights == {"stable": 10, "canary": 90}
    state = SavedState(path)
    state.load(configured)
    live = [Backend("stable", "http://127.0.0.1:1", "resolved", 10), Backend("canary", "http://127.0.0.1:2", "m", 90,
                                                                             pinned=True)]
    assert state.save({"stable": 10, "canary": 90}, None, backends=live)
    again = SavedState(path).load(configured)
    assert again.backends is None and again.weights == {"stable": 10, "canary": 90}  # same list: the config's
    changed = SavedState(path).load([*configured[:1], BackendConfig(name="canary", url="http://127.0.0.1:3")])
    assert changed.weights == {"stable": 10, "canary": 90}  # names fit: the weights hold, as before
