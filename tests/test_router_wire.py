"""What crosses the router is defined once (qlift.router.wire): the router builds those types, its client
returns them and the rollout reads them, and a real router's admin JSON is exactly what they describe."""

from __future__ import annotations

import ast
import json
import time
import typing
from pathlib import Path

import httpx
from faults import RouterProcess, TinyBackend
from pydantic import BaseModel

import qlift
from qlift.router import wire

TOKEN = "wire-secret"
WIRE_TYPES = ("AnswerRecord", "BackendState", "RequestBatch", "RequestRecord", "RouterState", "ShadowAnswer",
              "ShadowBatch", "ShadowPair", "ShadowSettings", "ShadowState")


def test_the_router_its_client_and_the_rollout_use_the_wire_types_themselves() -> None:
    from qlift.rollout import shadow as rollout_shadow
    from qlift.rollout import sources
    from qlift.router import admin, answers, app, balancer, client, datapath, pairs, proxy, shadow, state

    for name in WIRE_TYPES:
        if name != "ShadowSettings":
            assert getattr(client, name) is getattr(wire, name), name
    # the router builds them ...
    assert app.RouterState is wire.RouterState and balancer.BackendState is wire.BackendState
    assert shadow.ShadowState is wire.ShadowState and datapath.RequestRecord is wire.RequestRecord
    assert answers.AnswerRecord is wire.AnswerRecord and pairs.ShadowAnswer is wire.ShadowAnswer
    assert admin.ShadowSettings is state.ShadowSettings is shadow.ShadowSettings is wire.ShadowSettings
    assert proxy.USAGE_KEYS is wire.USAGE_KEYS
    # ... the client answers with them, through public methods ...
    hints = {name: typing.get_type_hints(getattr(client.RouterClient, name))["return"]
             for name in ("state", "set_weights", "requests", "set_shadow", "clear_shadow", "shadow_pairs")}
    assert hints == {"state": wire.RouterState, "set_weights": wire.RouterState, "requests": wire.RequestBatch,
                     "set_shadow": wire.RouterState, "clear_shadow": wire.RouterState,
                     "shadow_pairs": wire.ShadowBatch}
    # ... and the rollout reads them.
    assert rollout_shadow.ShadowBatch is wire.ShadowBatch and rollout_shadow.ShadowAnswer is wire.ShadowAnswer
    assert sources.RequestBatch is wire.RequestBatch and sources.RequestRecord is wire.RequestRecord


def test_no_other_module_of_the_router_or_the_rollout_defines_a_wire_type_or_calls_the_private_call() -> None:
    root = Path(qlift.__file__).parent
    for path in [*root.joinpath("router").glob("*.py"), *root.joinpath("rollout").glob("*.py")]:
        if path.name == "wire.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        assert not classes & set(WIRE_TYPES), (path, classes & set(WIRE_TYPES))
        private = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "_call"
                   and path.name != "client.py"]
        assert not private, (path, private)


def _wait(cond, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _raw(router: RouterProcess, path: str) -> str:
    resp = httpx.get(router.url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.text


def _same_json(raw: str, model: BaseModel) -> None:
    """The router's JSON is the wire type's, key for key and in order (nothing the type leaves out or adds)."""
    sent = json.loads(raw)
    assert json.dumps(sent) == json.dumps(model.model_dump(exclude_unset=True)), (sent, model)


def test_a_real_routers_admin_json_is_the_wire_types_through_the_public_client(tmp_path: Path) -> None:
    from qlift.rollout.shadow import ShadowSource

    with TinyBackend("m", tokens=4) as stable, TinyBackend("m", tokens=6) as canary, \
            RouterProcess("--backend", f"stable={stable.url}#m", "--backend", f"canary={canary.url}#m",
                          "--weight", "stable=100", "--weight", "canary=0", "--public-model", "pub",
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        admin = router.admin()
        state = admin.set_shadow("canary", 100, max_inflight=4)
        assert isinstance(state, wire.RouterState) and state.shadow is not None
        assert (state.shadow.version, state.shadow.percent, state.shadow.partner) == ("canary", 100.0, None)
        _same_json(_raw(router, "/admin/state"), wire.RouterState.model_validate_json(_raw(router, "/admin/state")))
        assert '"partner"' not in _raw(router, "/admin/state")  # left out when unset, as before

        for i, stream in enumerate((False, True, False)):
            body = {"model": "pub", "max_tokens": 8, "stream": stream, "response_format": {"type": "json_object"},
                    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{i}"}]}
            assert httpx.post(router.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        _wait(lambda: admin.shadow_pairs().next == 3)

        batch = admin.shadow_pairs()
        assert isinstance(batch, wire.ShadowBatch) and [p.seq for p in batch.pairs] == [1, 2, 3]
        assert {(p.primary.backend, p.shadow.backend) for p in batch.pairs} == {("stable", "canary")}
        assert [p.request["stream"] for p in batch.pairs] == [False, True, False]
        assert all(p.primary.ok and p.shadow.ok and p.shadow.text.split() == ["hi"] * 6 for p in batch.pairs)
        raw_pairs = _raw(router, "/admin/shadow?since=0")
        _same_json(raw_pairs, wire.ShadowBatch.model_validate_json(raw_pairs))

        records = admin.requests(since=0)
        assert isinstance(records, wire.RequestBatch) and [r.backend for r in records.requests] == ["stable"] * 3
        sample = records.requests[0].answer
        assert sample is not None and sample.request() == {
            "prompt": "q0", "system": "be brief", "response_format": {"type": "json_object"}}
        assert records.requests[1].stream and records.requests[1].finish_reason == "length"
        raw_records = _raw(router, "/admin/requests?since=0")
        _same_json(raw_records, wire.RequestBatch.model_validate_json(raw_records))

        # The rollout reads the same pairs through the public methods; a partner shows in the state.
        source = ShadowSource(router.url, TOKEN, stable="stable")
        turned_on = source.start("canary", 50, 2, partner="stable")
        assert turned_on == admin.state().model_dump() and turned_on["shadow"]["partner"] == "stable"
        ev = source.collect()
        assert [(p.seq, p.primary.text, p.shadow.text) for p in ev.pairs] == [
            (p.seq, p.primary.text, p.shadow.text) for p in batch.pairs]
        assert source.cursor == 3
        source.stop()
        assert admin.state().shadow is None and len(admin.shadow_pairs().pairs) == 3
