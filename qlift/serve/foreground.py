"""``qlift serve`` in the foreground: start vLLM through a ``ServeHandle``, hold it until SIGINT/SIGTERM or until it
dies, drain and stop it (``run``)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from qlift.serve.handle import ServeHandle
from qlift.serve.launch import LaunchSpec, check_plan
from qlift.serve.pool import PoolHandle, PoolSpec
from qlift.serve.restart import write_record
from qlift.vllm.logview import LogView


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class ServeOutcome:
    run_dir: Path
    log_path: Path
    pid: int
    stopped_by: str  # the signal's name
    stop_s: float = 0.0  # from the signal until vLLM was gone (the drain included)


def drain_seconds(spec: LaunchSpec) -> int:
    """How long vLLM lets in-flight requests finish on SIGTERM (its --shutdown-timeout; 0: it aborts them)."""
    return int(spec.engine_args.get("shutdown_timeout") or 0)


def run(spec: LaunchSpec, *, on_ready: Callable[[LaunchSpec, int], None] | None = None,
        view: LogView | None = None) -> ServeOutcome:
    """Serve until SIGINT/SIGTERM or until vLLM dies (an error); /health must answer within the options'
    --timeout. On a signal once it is up, vLLM drains its in-flight requests (up to ``drain_seconds``), then
    its process group is stopped. ``view``: what of vLLM's log reaches the terminal."""
    check_plan(spec.plan)
    handle = ServeHandle.create(spec, view=view)
    write_record(spec)  # what `qlift lora load --restart-if-full` restarts this server with
    return hold(handle, lambda: on_ready(spec, handle.pid) if on_ready is not None else None)


def run_pool(pool: PoolSpec, *, on_ready: Callable[[PoolHandle], None] | None = None,
             view: LogView | None = None) -> ServeOutcome:
    """``run`` for a pool of replicas behind vllm-router (qlift.serve.pool): its record names every replica, so
    `qlift lora load` reaches each; a replica that dies is taken out while the others serve."""
    check_plan(pool.front.plan)
    handle = PoolHandle.create_pool(pool, view=view)
    write_record(pool.front, replicas=pool.replica_urls)
    return hold(handle, lambda: on_ready(handle) if on_ready is not None else None)


def hold(handle: ServeHandle, ready: Callable[[], None]) -> ServeOutcome:
    """Launch ``handle`` and hold it until a signal (drain, then stop) or until it dies (raise)."""
    spec = handle.spec
    stopped: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopped.append(signum)  # acted on at the next poll: never between fork and bookkeeping

    def check() -> None:
        if stopped:
            raise _Stop(stopped[0])

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        handle.launch(on_poll=check)
        ready()
        handle.wait(on_poll=check)
        raise AssertionError("unreachable: wait() returns only by raising")
    except _Stop as stop:
        drain = drain_seconds(spec) if handle.ready else 0
        if drain and handle.view.note is not None:
            handle.view.note(f"{stop}: vLLM is finishing in-flight requests (up to {drain} s), then stops")
        took = handle.stop(drain_s=drain)
        if handle.ready:
            handle.flush_log()  # vLLM's own account of the drain
        return ServeOutcome(spec.run_dir, handle.server.log_path, handle.pid, str(stop), took)
    finally:
        handle.stop()
        for s, handler in old.items():
            signal.signal(s, handler)
