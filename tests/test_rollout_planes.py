"""A data plane added by one table entry and one module (memory_plane.py): the spec takes its name and validates
its section, preflight and the controller run a rollout on it, and nothing else names it. The shipped planes'
entries agree with the spec's fields, and the router's admin token reaches what talks to the router."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import memory_plane
import pytest
from test_rollout_journal import healthy, run, spec

from qlift.errors import BadInputError, ExternalToolError, IncompatibleError
from qlift.rollout import preflight
from qlift.rollout.adapter import resolve_target
from qlift.rollout.dataplane import RouterDataPlane, check_stable_up, check_versions, make_data_plane
from qlift.rollout.interruptions import live_weights
from qlift.rollout.journal import Journal
from qlift.rollout.planes import PLANES, register_plane
from qlift.rollout.sources import RouterSource, make_collector
from qlift.rollout.spec import PromoteOptions, RolloutSpec, build_spec
from qlift.rollout.states import State

MEMORY = {"data_plane": "memory", "memory": {"store": "t", "servers": {"s": "http://127.0.0.1:1",
                                                                      "c": "http://127.0.0.1:1#c-model"}}}
BACKENDS = {"backends": {"s": "http://127.0.0.1:1", "c": "http://127.0.0.1:1"}}  # vLLM /metrics: the evidence


@pytest.fixture
def memory() -> Iterator[None]:
    register_plane(memory_plane.KIND)
    memory_plane.STORES.clear()
    try:
        yield
    finally:
        PLANES.pop("memory")


def memory_spec(**kw: Any) -> RolloutSpec:
    return build_spec({"stable": "s", "canary": "c", **MEMORY, **BACKENDS, **kw}, {})


def refusal(data: dict[str, Any]) -> BadInputError:
    with pytest.raises(BadInputError) as err:
        build_spec({"stable": "s", "canary": "c", **BACKENDS, **data}, {})
    return err.value


def test_the_spec_takes_a_registered_planes_name_and_section_and_journals_them(memory: None) -> None:
    sp = memory_spec()
    section = sp.plane_section(memory_plane.KIND)
    assert isinstance(section, memory_plane.MemorySpec) and section.store == "t"
    dumped = sp.model_dump(mode="json")
    assert dumped["memory"] == MEMORY["memory"] and dumped["data_plane"] == "memory"
    again = RolloutSpec.model_validate(json.loads(json.dumps(dumped)))  # as a journal reads it back
    assert again.plane_section(memory_plane.KIND) == section
    options = PromoteOptions.model_validate(MEMORY)  # a release's promote options carry it on to the rollout
    rolled = options.rollout_spec(stable="s", canary="c", router=None, **BACKENDS)
    assert rolled.plane_section(memory_plane.KIND) == section


def test_the_spec_validates_the_registered_section_by_its_entry(memory: None) -> None:
    assert refusal({"data_plane": "memory"}).message.endswith(": data_plane memory needs a memory: section")
    wrong = refusal({**MEMORY, "memory": {"servers": 3}})
    assert wrong.field == "memory.servers" and "valid dictionary" in wrong.message
    assert refusal({**MEMORY, "memory": {"servers": {}, "nope": 1}}).field == "memory.nope"
    lacking = refusal({**MEMORY, "memory": {"servers": {"s": "http://127.0.0.1:1"}}})
    assert lacking.message.endswith(": memory.servers lacks c")
    assert "qlift router" in refusal({**MEMORY, "shadow": {"percent": 10}}).message  # no MIRROR capability


def test_without_its_entry_the_plane_and_its_section_are_refused() -> None:
    assert "memory" not in PLANES
    assert refusal({"data_plane": "memory"}).field == "data_plane"
    assert refusal({"memory": {"servers": {}}}).field == "memory"


def test_preflight_asks_the_new_plane_only_through_its_protocols(memory: None, tmp_path: Path) -> None:
    sp = memory_spec()
    plane = make_data_plane(sp, router_token=None)  # built by the maker its entry names
    assert isinstance(plane, memory_plane.MemoryDataPlane)
    check_versions(plane, ["s", "c"])
    check_stable_up(plane, "s", allow_down=False)
    with Journal(tmp_path / "j.sqlite") as journal:
        preflight.check_start_state(plane, sp, journal, None, force=False)
        plane.set_weights({"s": 50, "c": 50})
        with pytest.raises(BadInputError, match="splits users s 50 / c 50"):
            preflight.check_start_state(plane, sp, journal, None, force=False)
    with pytest.raises(ExternalToolError, match="the canary c at http://127.0.0.1:1 does not answer"):
        preflight.check_canary_serves(plane, sp)  # the address the plane gave is probed
    with models_server(["c-model"]) as url:
        served = memory_spec(memory={"store": "t", "servers": {"s": url, "c": f"{url}#c-model"}})
        preflight.check_canary_serves(make_data_plane(served, router_token=None), served)
    assert preflight.out_of_rotation(plane, "c") is None


def test_the_controller_rolls_out_on_the_new_plane(memory: None, tmp_path: Path) -> None:
    sp = spec(**MEMORY)
    plane = make_data_plane(sp, router_token=None)
    final, _, _ = run(tmp_path, sp, [(healthy("c", 20), healthy("s", 20))], plane)  # type: ignore[arg-type]
    assert final.state == State.PROMOTED
    assert memory_plane.STORES["t"] == {"s": 0, "c": 100}


def test_the_table_decides_what_the_router_alone_does(memory: None) -> None:
    sp = memory_spec()
    assert make_collector(sp, {}, router_token=None).primary.name == "none"  # its entry's evidence source
    assert live_weights(sp) is None
    with pytest.raises(IncompatibleError, match="the memory data plane has no runtime loading"):
        resolve_target(sp, "adapter", router_token=None)


def test_the_shipped_entries_agree_with_the_spec_fields() -> None:
    for p in PLANES.values():
        if p.section is not None:
            assert p.settings is not None and RolloutSpec.model_fields[p.section].annotation == p.settings | None
    with pytest.raises(ValueError, match="has that name or section already"):
        register_plane(PLANES["nginx"])


def test_the_admin_token_is_handed_to_what_talks_to_the_router(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", "from-the-environment")  # read at the entry only, never down here
    sp = spec()
    plane = make_data_plane(sp, router_token="given")
    assert isinstance(plane, RouterDataPlane) and plane.client.token == "given"
    source = make_collector(sp, {}, router_token="given").primary
    assert isinstance(source, RouterSource) and source.client.token == "given"
    assert make_data_plane(sp, router_token=None).client.token is None  # type: ignore[attr-defined]


class _Models(BaseHTTPRequestHandler):
    ids: list[str] = []

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        body = json.dumps({"object": "list", "data": [{"id": i, "object": "model"} for i in self.ids]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class models_server:  # noqa: N801  (used as a context manager, named as one)
    """A server on a free 127.0.0.1 port answering GET /v1/models with ``ids``."""

    def __init__(self, ids: list[str]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Models,), {"ids": ids}))

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_port}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
