"""LoRA adapters on a pool (`qlift serve --replicas`): vllm-router forwards ``/v1/load_lora_adapter`` to one
replica, so a load or unload through the pool's URL goes to each replica directly (the pool's serve record names
them). Slots are counted per replica (each is its own vLLM instance, qlift.serve.lora_slots); every replica's
room is checked before any loads, and a load that fails on one replica is unloaded from those that took it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Unpack

from qlift.errors import IncompatibleError
from qlift.serve.lora import LoraCheck
from qlift.serve.lora_runtime import LoadOptions
from qlift.serve.restart import ServeRecord, find, restart

log = logging.getLogger(__name__)


def pool_at(server: str) -> ServeRecord | None:
    """The record of the pool whose vllm-router listens at ``server``; None for anything else (one replica too)."""
    rec = find(server)
    return rec if rec is not None and rec.is_pool_at(server) else None


def load_on_pool(pool: ServeRecord, name: str, path: Path, **how: Unpack[LoadOptions]) -> LoraCheck:
    """``lora_runtime.load`` on every replica of ``pool``; all or none keep it."""
    from qlift.serve import lora_runtime, lora_slots

    api_key = how.get("api_key")
    try:
        for url in pool.replicas:
            lora_slots.room_for(url, name, api_key=api_key)
    except IncompatibleError:
        if not how.get("restart_if_full"):
            raise
        adapters = {a.name: a.path for a in lora_runtime.list_adapters(pool.replicas[0], api_key=api_key) if a.path}
        restart(pool, adapters)
        again = pool_at(pool.base_url)
        if again is None:
            raise
        pool = again
    each: LoadOptions = {**how, "restart_if_full": False}  # the pool's room was checked above
    loaded: list[str] = []
    checked: LoraCheck | None = None
    try:
        for url in pool.replicas:
            checked = lora_runtime.load(url, name, path, **each)
            loaded.append(url)
    except BaseException:
        for url in loaded:
            lora_runtime.unload(url, name, api_key=api_key, missing_ok=True)
        raise
    assert checked is not None
    log.info("loaded %s on %d replicas of %s", name, len(loaded), pool.base_url)
    return checked


def unload_on_pool(pool: ServeRecord, name: str, *, api_key: str | None = None, missing_ok: bool = False) -> bool:
    """Unload ``name`` from every replica; True if any held it."""
    from qlift.serve import lora_runtime

    held = [lora_runtime.unload(url, name, api_key=api_key, missing_ok=True) for url in pool.replicas]
    if not any(held) and not missing_ok:
        return lora_runtime.unload(pool.replicas[0], name, api_key=api_key)  # its own "serves no adapter" refusal
    return any(held)

