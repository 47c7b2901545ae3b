"""The next release, hands-off: `qlift promote start --next NAME=URL[#MODEL]` rolls each new version out over
whatever holds 100% of one running `qlift router`, adding its backend at weight 0 and retiring the version the
rollout leaves unserved, under continuous OpenAI SDK traffic, with no router restart and no failed request.
The backends are small scripted servers; the router, the controller and the judge are the product's own."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from faults import RouterProcess, ScriptedBackend, SdkLoad, helpful_order_answer, refusing_answer

from qlift.errors import ExternalToolError
from qlift.rollout.journal import Journal
from qlift.rollout.states import EventKind
from qlift.vllm.process import free_port

TOKEN = "train-admin-token"
FAST = ["--steps", "50,100", "--interval", "2s", "--min-requests", "10"]


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)


def _events(journal: Path) -> list[tuple[int, str, str, str]]:
    """(rollout, kind, backend, why) of every add and retirement the journal holds."""
    kinds = (EventKind.BACKEND_ADDED, EventKind.BACKEND_RETIRING, EventKind.BACKEND_RETIRED)
    out = []
    with Journal(journal) as j:
        last = j.latest()
        for rid in range(1, (last.id if last else 0) + 1):
            for e in j.history(rid)["events"]:
                if e["kind"] in kinds:
                    out.append((rid, e["kind"], e["detail"]["backend"], e["detail"].get("why", "")))
    return out


def test_v1_to_v4_through_one_router_with_a_rollback_and_no_failed_request(
        run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = tmp_path / "rollouts.sqlite"
    with ScriptedBackend("m-v1", helpful_order_answer) as v1, ScriptedBackend("m-v2", helpful_order_answer) as v2, \
            ScriptedBackend("m-v3", refusing_answer) as v3, ScriptedBackend("m-v4", helpful_order_answer) as v4, \
            RouterProcess("--backend", f"v1={v1.url}#m-v1", "--public-model", "pub",
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        admin, pid = router.admin(), router.proc.pid if router.proc else None
        started = admin.state().started_at

        def start(version: str, url: str, model: str) -> Any:
            return run_cli("promote", "start", "--router", router.url, "--next", f"{version}={url}#{model}",
                           *FAST, "--journal", journal, "--json")

        with SdkLoad(router.url, prompt=lambda i: f"Where is my order A{i % 50:04d}?", limit=30000, timeout_s=120,
                     pause_s=0.01) as traffic:
            # v1 -> v2, promoted; the router does not answer the retirement (a killed process, a blip): v1 stays
            # at weight 0 with the intent journaled, and the next `resume` retires it
            def unreachable(self: Any, name: str) -> Any:
                raise ExternalToolError("router did not answer DELETE /admin/backends", tool="router")

            with monkeypatch.context() as m:
                m.setattr("qlift.router.client.RouterClient.retire_backend", unreachable)
                r = start("v2", v2.url, "m-v2")
            assert r.exit_code == 0 and json.loads(r.stdout)["state"] == "promoted", r.stderr[-2000:]
            assert admin.state().weights == {"v1": 0, "v2": 100}
            assert (1, EventKind.BACKEND_RETIRING, "v1", "promoted") in _events(journal)
            assert not any(kind == EventKind.BACKEND_RETIRED for _, kind, _, _ in _events(journal))
            r = run_cli("promote", "resume", "--journal", journal)
            assert r.exit_code == 1 and "already promoted" in r.stderr, r.stderr[-500:]
            assert admin.state().weights == {"v2": 100}

            # v2 -> v3, whose every answer is a refusal: rolled back, and v3 retired
            r = start("v3", v3.url, "m-v3")
            st = json.loads(r.stdout)
            assert r.exit_code == 10 and st["state"] == "rolled_back", (r.stderr[-2000:], st.get("reason"))
            assert admin.state().weights == {"v2": 100}

            # v2 -> v4, promoted; v2 retired
            r = start("v4", v4.url, "m-v4")
            assert r.exit_code == 0 and json.loads(r.stdout)["state"] == "promoted", r.stderr[-2000:]
            served = traffic.ok
            deadline = time.monotonic() + 10
            while traffic.ok < served + 20 and time.monotonic() < deadline:
                time.sleep(0.05)

        state = admin.state()
        assert [b.name for b in state.backends] == ["v4"] and state.weights == {"v4": 100}
        assert router.proc is not None and router.proc.pid == pid and router.proc.poll() is None
        assert state.started_at == started  # the same router process throughout: never restarted
        assert not traffic.failures and traffic.ok > 100, (traffic.failures.most_common(3), traffic.ok)
        assert v3.requests > 0 and v4.requests > 0  # each canary served users on the way

    assert _events(journal) == [
        (1, EventKind.BACKEND_ADDED, "v2", ""), (1, EventKind.BACKEND_RETIRING, "v1", "promoted"),
        (1, EventKind.BACKEND_RETIRED, "v1", "promoted"),
        (2, EventKind.BACKEND_ADDED, "v3", ""), (2, EventKind.BACKEND_RETIRING, "v3", "rolled back"),
        (2, EventKind.BACKEND_RETIRED, "v3", "rolled back"),
        (3, EventKind.BACKEND_ADDED, "v4", ""), (3, EventKind.BACKEND_RETIRING, "v2", "promoted"),
        (3, EventKind.BACKEND_RETIRED, "v2", "promoted"),
    ]


def test_next_is_refused_in_one_line_and_leaves_the_router_as_it_was(run_cli: Any, tmp_path: Path) -> None:
    journal = tmp_path / "rollouts.sqlite"
    with ScriptedBackend("m-v1", helpful_order_answer) as v1, ScriptedBackend("m-v2", helpful_order_answer) as v2, \
            RouterProcess("--backend", f"v1={v1.url}#m-v1", "--backend", f"v2={v2.url}#m-v2", "--weight", "v1=50",
                          "--weight", "v2=50", "--public-model", "pub", log_path=tmp_path / "router.log",
                          token=TOKEN) as router:
        admin = router.admin()
        base = ["promote", "start", "--router", router.url, "--journal", journal, *FAST]

        r = run_cli(*base, "--next", "v3=http://127.0.0.1:1#m-v3")
        assert r.exit_code == 2 and "no version holds 100% of the router" in r.stderr, r.stderr
        assert "v1 50%, v2 50%" in r.stderr

        r = run_cli(*base, "--next", "v3=http://127.0.0.1:1#m-v3", "--stable", "v1")
        assert r.exit_code == 2 and "--stable cannot be given with it" in r.stderr, r.stderr

        r = run_cli(*base, "--next", "v3")
        assert r.exit_code == 2 and "is not NAME=URL[#MODEL]" in r.stderr, r.stderr

        admin.set_weights({"v1": 100, "v2": 0})
        r = run_cli(*base, "--next", "v1=http://127.0.0.1:1#m-v3")
        assert r.exit_code == 2 and "v1 already holds 100%" in r.stderr, r.stderr

        # the next version's server does not answer: refused after its backend was added, which is retired again
        r = run_cli(*base, "--next", f"v3=http://127.0.0.1:{free_port()}#m-v3")
        assert r.exit_code == 8, r.stderr[-1000:]
        assert [b.name for b in admin.state().backends] == ["v1", "v2"]
        assert admin.state().weights == {"v1": 100, "v2": 0}

        r = run_cli(*base, "--next", "v3=http://127.0.0.1:1#m-v3", "--data-plane", "nginx")
        assert r.exit_code == 6 and "--next adds the next version to the qlift router" in r.stderr, r.stderr
    with Journal(journal) as j:
        assert j.latest() is None  # nothing was started
