"""A running vLLM server's adapters: list, load and unload them at runtime, checked first.

vLLM lists an adapter in ``/v1/models`` with ``root`` (the path it loaded) and ``parent`` (its
base's served name), and loads or unloads one through ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` when it runs with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
(`qlift serve --lora-runtime`). A load here is checked against the base the server serves
(its ``root`` in ``/v1/models``, or ``base_dir``) as `qlift serve --lora` checks, then asked to
answer one token, so a load that "succeeded" but cannot generate is reported, not kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack

from qlift.errors import BadInputError, ExternalToolError, IncompatibleError, NotFoundError
from qlift.serve import lora_slots
from qlift.serve.lora import LoraCheck, check_adapter, check_lora_name
from qlift.serve.served_models import ServedModel, served_models
from qlift.vllm.client import ADAPTER_LOAD_TIMEOUT_S, VllmClient, error_text
from qlift.vllm.client import server_url as _url

log = logging.getLogger(__name__)


@dataclass
class ServedAdapter:
    """An adapter a server holds, as `qlift lora list` shows it."""

    name: str
    base: str | None
    path: str | None
    content_hash: str | None  # None when its path is not a directory on this machine


def base_model(server: str, *, api_key: str | None = None) -> ServedModel:
    bases = [m for m in served_models(server, api_key=api_key) if not m.is_adapter]
    if not bases:
        raise ExternalToolError(f"{_url(server)} lists no base model", tool="vllm")
    return bases[0]


def find_served(server: str, name: str, *, api_key: str | None = None) -> ServedModel | None:
    """The entry named ``name`` in the server's /v1/models (a base or an adapter), or None."""
    return next((m for m in served_models(server, api_key=api_key) if m.id == name), None)


def local_base_dir(server: str, *, api_key: str | None = None) -> Path:
    root = base_model(server, api_key=api_key).root
    if not root or not Path(root).is_dir():
        raise BadInputError(f"the server's base model ({root}) is not a directory on this machine, so the adapter "
                            "cannot be checked against it", field="--base",
                            hint="Pass --base DIR (a copy of the base the server serves).")
    return Path(root)


def adapter_hash(path: str | Path | None) -> str | None:
    """The lineage content hash of an adapter dir (its qlift.json's records where it has one)."""
    from qlift.lineage import describe_input

    if path is None or not Path(path).is_dir():
        return None
    return describe_input("adapter", Path(path))[0].content_hash


def list_adapters(server: str, *, api_key: str | None = None) -> list[ServedAdapter]:
    return [ServedAdapter(name=m.id, base=m.parent, path=m.root, content_hash=adapter_hash(m.root))
            for m in served_models(server, api_key=api_key) if m.is_adapter]


def check_for_server(server: str, name: str, path: Path, *, base_dir: Path | None = None,
                     max_lora_rank: int | None = None, api_key: str | None = None) -> LoraCheck:
    """The checks of `qlift serve --lora`, against the base the server serves."""
    from qlift.models.modeldir import ModelDir

    check_lora_name(name, flag="NAME")
    base = ModelDir.open(base_dir or local_base_dir(server, api_key=api_key))
    return check_adapter(name, path, base, max_lora_rank=max_lora_rank)


class LoadOptions(TypedDict, total=False):
    """How ``load`` checks and loads an adapter (each left out: its default)."""

    base_dir: Path | None  # the server's base on this machine, when its /v1/models root is not (default: that root)
    max_lora_rank: int | None  # the server's max_lora_rank, the adapter's rank checked against it
    api_key: str | None
    verify: bool  # make it answer one token after loading (default: True)
    restart_if_full: bool  # restart the server first when the load would fill its last slot (default: refuse)


def load(server: str, name: str, path: Path, **how: Unpack[LoadOptions]) -> LoraCheck:
    """Check adapter ``path``, load it into ``server`` as ``name`` and make it answer one token. A load that would
    fill the server's last adapter slot is refused, or the server restarted first with ``restart_if_full``
    (qlift.serve.lora_slots). A pool's URL (`qlift serve --replicas`): every replica (qlift.serve.pool_lora)."""
    from qlift.serve.pool_lora import load_on_pool, pool_at

    if (pool := pool_at(server)) is not None:
        return load_on_pool(pool, name, path, **how)
    api_key, verify = how.get("api_key"), how.get("verify", True)
    checked = check_for_server(server, name, path, base_dir=how.get("base_dir"),
                               max_lora_rank=how.get("max_lora_rank"), api_key=api_key)
    served = find_served(server, name, api_key=api_key)
    if served is not None:
        if not served.is_adapter:
            raise BadInputError(f"{name} is the server's base model name", field="NAME",
                                hint="Give the adapter another name.")
        if served.root and Path(served.root).resolve() == checked.path:
            log.info("adapter %s is already loaded from %s", name, checked.path)
            if verify:
                answer_one_token(server, name, api_key=api_key)
            return checked
        raise BadInputError(f"the server already serves an adapter named {name} (from {served.root})",
                            field="NAME", hint=f"Unload it first: qlift lora unload {name} --server {_url(server)}.")
    with lora_slots.slots_lock(server):
        slots = lora_slots.room_for(server, name, api_key=api_key, restart_if_full=how.get("restart_if_full", False))
        reply = VllmClient(server, api_key=api_key).load_adapter(name, checked.path)
        if slots is not None and reply.ok:  # activated: it holds a slot from now on, unloaded or not
            slots.loads.append(lora_slots.SlotLoad(name, str(checked.path)))
            lora_slots.save(slots)
    if reply.runtime_off:
        raise IncompatibleError(f"{_url(server)} does not load adapters at runtime",
                                hint="Start it with `qlift serve BASE --lora-runtime` "
                                     "(VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).")
    if not reply.ok:
        if "max_lora_rank" in reply.error:
            raise IncompatibleError(f"the server refused adapter {name}: {reply.error}",
                                    hint="Restart the server with a larger --set max_lora_rank, or merge the adapter.")
        raise ExternalToolError(f"the server refused adapter {name} ({reply.status}): {reply.error}",
                                hint="See the server's log.", tool="vllm")
    if verify:
        try:
            answer_one_token(server, name, api_key=api_key)
        except ExternalToolError:
            unload(server, name, api_key=api_key, missing_ok=True)
            raise
    return checked


def answer_one_token(server: str, name: str, *, api_key: str | None = None) -> None:
    resp = VllmClient(server, api_key=api_key).request(
        "POST", "/v1/completions", timeout_s=ADAPTER_LOAD_TIMEOUT_S,  # its first answer may still be slow
        json={"model": name, "prompt": "Hello", "max_tokens": 1, "temperature": 0})
    if resp.status_code >= 400:
        raise ExternalToolError(f"adapter {name} was loaded but does not answer ({resp.status_code}): "
                                f"{error_text(resp)}", hint="See the server's log.", tool="vllm")


def unload(server: str, name: str, *, api_key: str | None = None, missing_ok: bool = False) -> bool:
    """Unload adapter ``name``; True if it was loaded. Refuses the base model's name. A pool: from every replica."""
    from qlift.serve.pool_lora import pool_at, unload_on_pool

    if (pool := pool_at(server)) is not None:
        return unload_on_pool(pool, name, api_key=api_key, missing_ok=missing_ok)
    served = find_served(server, name, api_key=api_key)
    if served is not None and not served.is_adapter:
        raise BadInputError(f"{name} is the server's base model, not an adapter", field="NAME")
    if served is None:
        if missing_ok:
            return False
        raise NotFoundError(f"{_url(server)} serves no adapter named {name}",
                            hint=f"`qlift lora list --server {_url(server)}` shows what it serves.")
    reply = VllmClient(server, api_key=api_key).unload_adapter(name)
    if reply.runtime_off:
        raise IncompatibleError(f"{_url(server)} does not unload adapters at runtime",
                                hint="Start it with `qlift serve BASE --lora-runtime`.")
    if reply.status == 404 and missing_ok:
        return False
    if not reply.ok:
        raise ExternalToolError(f"the server refused to unload {name} ({reply.status}): {reply.error}", tool="vllm")
    return True
