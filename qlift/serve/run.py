"""The serve stage's entry point: ``run(ServeInputs, ServeOptions) -> ServeOutcome``.

It does what ``qlift serve`` does without its printing: resolve the recipe, check the memory plan and that
this CPU can run the model, raise the open-files limit, start vLLM and block until SIGINT/SIGTERM. A dry run
is ``launch.prepare`` (a plan, no server), so ``options.dry_run`` is refused here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qlift.errors import BadInputError

if TYPE_CHECKING:
    from qlift.serve.launch import LaunchSpec, ServeOutcome
    from qlift.serve.options import ServeOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeInputs:
    """What a server consumes: the model directory (adapters are ``ServeOptions.loras``)."""

    model: Path


def run(inputs: ServeInputs, options: ServeOptions) -> ServeOutcome:
    """Serve ``inputs.model`` as ``options`` say until stopped; the outcome names the signal that stopped it."""
    from qlift.cpu_support import require_cpu_support
    from qlift.hardware import resolve
    from qlift.serve.launch import check_plan, prepare
    from qlift.serve.launch import run as launch
    from qlift.vllm.process import raise_open_files_limit

    if options.dry_run:
        raise BadInputError("serve's run() starts a server; a dry run is launch.prepare()",
                            hint="Call qlift.serve.launch.prepare(model, options) for the plan.")
    hw = resolve(options.gpu, options.gpus)
    spec = prepare(inputs.model, options, hw)
    require_cpu_support(inputs.model, hardware=hw)
    check_plan(spec.plan)
    note = raise_open_files_limit()
    if note:
        log.warning("%s", note)

    def on_ready(spec: LaunchSpec, pid: int) -> None:
        log.info("serving %s at %s/v1 (pid %d)", spec.served_model_name, spec.base_url, pid)

    return launch(spec, on_ready=on_ready)
