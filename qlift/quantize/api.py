"""``quantize``: AWQ (W4A16) or FP8 (dynamic) with llm-compressor, output that vLLM loads.

Everything that can be checked from config and safetensors headers is checked here, in
qlift's own environment, before the tool environment is built or any weight is loaded.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlift.errors import ExternalToolError, IncompatibleError
from qlift.fsutil import FileHashes, atomic_output_dir, check_output_path, copy_file, dir_size, hash_threads
from qlift.lineage import still_written, unhashed_files, utc_now, write_manifest
from qlift.models.modeldir import GENERATION_CONFIG, TOKENIZER_FILES, ModelDir
from qlift.models.ref import ModelRef
from qlift.quantize import options
from qlift.quantize.calib import BUILTIN_NAME, load_calibration
from qlift.quantize.compute import compute_plan
from qlift.quantize.env import quantize_env
from qlift.quantize.groups import ALWAYS_IGNORED, choose_group_size, matches
from qlift.quantize.hardware import advice, has_nvidia_gpu, resolve_target
from qlift.quantize.options import QuantizeOptions
from qlift.quantize.runner import run_worker

log = logging.getLogger(__name__)

Method = options.Method
SCHEMES = {
    "awq": "W4A16 (int4 asymmetric, group-wise; AWQ)",
    "fp8": "FP8_DYNAMIC (per-channel weights, per-token activations)",
}


@dataclass
class QuantizeResult:
    output: str
    method: str
    scheme: str
    format: str  # compressed-tensors format: pack-quantized (AWQ), float-quantized (FP8)
    device: str
    group_size: int | None
    num_samples: int | None
    seq_len: int | None
    calibration: str | None
    ignore: list[str]
    warnings: list[str]
    size_bytes: int
    source_size_bytes: int
    seconds: float
    llmcompressor: str
    env_path: str
    env_created: bool
    log: str
    extra: dict[str, Any] = field(default_factory=dict)
    model_ref: ModelRef | None = None  # the output, hashed once (from the qlift.json it was written with)


def linear_input_dims(model: ModelDir, ignore: list[str]) -> dict[str, int]:
    """Input dim of every Linear that would be quantized, from the safetensors headers.

    2-D ``X.weight`` tensors are Linear layers except the embeddings (vocab rows) and the
    ignored ones; a weight is stored (out_features, in_features).
    """
    embeddings = set(embedding_modules(model))
    dims: dict[str, int] = {}
    for name, t in model.tensors.items():
        if len(t.shape) != 2 or not name.endswith(".weight"):
            continue
        module = name.removesuffix(".weight")
        if module in embeddings or matches(module, ignore):
            continue
        dims[module] = t.shape[1]
    return dims


def embedding_modules(model: ModelDir) -> list[str]:
    """Modules holding a (vocab rows, hidden) table other than lm_head: the input embeddings."""
    vocab = model.vocab_size
    return sorted(
        name.removesuffix(".weight")
        for name, t in model.tensors.items()
        if name.endswith(".weight") and len(t.shape) == 2 and t.shape[0] == vocab
        and name.removesuffix(".weight") not in ALWAYS_IGNORED
    )


def quantize(
    model: Path,
    out: Path,
    options: QuantizeOptions,
    *,
    on_status: Callable[[str], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    echo_log: bool = False,
    env_root: Path | None = None,
) -> QuantizeResult:
    """Quantize ``model`` into ``out`` (atomically) as ``options`` say (``group_size=None``: auto).

    ``on_status`` gets stage messages; ``on_step(done, total)`` gets AWQ's per-layer progress.
    """
    method, calib, num_samples, seq_len = options.method, options.calib, options.num_samples, options.seq_len
    group_size, device, force = options.group_size, options.device, options.force
    target_recipe = options.target_recipe
    say = on_status or (lambda msg: log.info("%s", msg))
    started, t0 = utc_now(), time.monotonic()
    ignore = list(options.ignore)
    src = _check_model(model, out, calib, force)

    job: dict[str, Any] = {"method": method, "model": str(src.path.resolve()), "device": device,
                           "ignore": ignore}
    if method == "awq":
        # Fails here, naming the layer, before anything slow starts.
        job["group_size"] = choose_group_size(linear_input_dims(src, [*ALWAYS_IGNORED, *ignore]), group_size)
        job["calibration"] = load_calibration(calib)
        job["num_samples"], job["seq_len"] = num_samples, seq_len
    else:
        job["embeddings"] = embedding_modules(src) or ["re:.*embed_tokens$"]

    target = resolve_target(target_recipe, device)
    warnings = advice(method, target)
    for w in warnings:
        log.warning("%s", w)
    worker_env = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
    if device == "cpu" or (device == "auto" and not has_nvidia_gpu()):
        plan = compute_plan(threads=options.threads, dtype=options.compute_dtype)
        job["threads"], job["compute_dtype"] = plan.threads, plan.dtype
        worker_env |= plan.env
        for note in plan.notes:
            say(note)

    # The lineage manifest needs every input and output file's sha256: the input is hashed on threads of its
    # own from now on (while the worker reads the same bytes) and the worker hashes each shard it writes.
    input_hasher = FileHashes(unhashed_files(src.path), threads=hash_threads())
    job["hash_threads"] = hash_threads()
    try:
        env = quantize_env(env_root)
        ensured = env.ensure(say)
        with atomic_output_dir(out, force=force, inputs=[src.path, *([calib] if calib else [])]) as tmp:
            job["output"] = str(tmp)
            result, log_path = run_worker(
                ensured.python, job, env=worker_env, echo_log=echo_log,
                on_progress=lambda ev: _progress(ev, say, on_step),
            )
            fmt = _finish_output(src, tmp)
            hashed = input_hasher.result() | _still_written(result.pop("written_hashes", None))
            inputs = {"model": src.path} | ({"calibration": Path(calib)} if calib else {})
            manifest = write_manifest(tmp, operation="quantize", inputs=inputs, started_at=started, precomputed=hashed,
                                      parameters=_parameters(method, fmt, calib, result))
    finally:
        input_hasher.cancel()
    return QuantizeResult(
        output=str(out), method=method, scheme=SCHEMES[method], format=fmt, device=result["device"],
        group_size=result.get("group_size"), num_samples=result.get("num_samples"),
        seq_len=result.get("seq_len"), calibration=manifest.parameters["calibration"], ignore=result["ignore"],
        warnings=warnings, size_bytes=dir_size(Path(out)), source_size_bytes=src.weight_bytes,
        seconds=round(time.monotonic() - t0, 2), llmcompressor=str(result.get("llmcompressor")),
        env_path=str(ensured.path), env_created=ensured.created, log=str(log_path),
        extra={"worker_seconds": result.get("worker_seconds"),
               "calibration_seconds": result.get("calibration_seconds"),
               "calibration_cpu_seconds": result.get("calibration_cpu_seconds"),
               "compute_dtype": result.get("compute_dtype"), "threads": result.get("threads"),
               "hashed_while_running": len(hashed)},
        model_ref=ModelRef.written(Path(out), manifest.outputs),
    )


def _parameters(method: str, fmt: str, calib: Path | None, result: dict[str, Any]) -> dict[str, Any]:
    """What the lineage manifest records of this quantization."""
    params = {k: result.get(k) for k in ("device", "group_size", "num_samples", "seq_len", "ignore")}
    return params | {"method": method, "scheme": SCHEMES[method], "format": fmt,
                     "calibration": str(calib) if calib else (BUILTIN_NAME if method == "awq" else None),
                     "llmcompressor": result.get("llmcompressor")}


def _still_written(written: object) -> dict[str, str]:
    """The worker's digests of the shards it wrote, for files still as they were when hashed."""
    if not isinstance(written, dict):
        return {}
    return {path: str(sha) for path, (sha, size, mtime_ns) in written.items()
            if still_written(Path(path), int(size), int(mtime_ns))}


def _progress(event: dict[str, Any], say: Callable[[str], None], on_step: Callable[[int, int], None] | None) -> None:
    if "step" in event:
        if on_step and event.get("total"):
            on_step(int(event["step"]), int(event["total"]))
    elif event.get("message"):
        say(str(event["message"]))


def _check_model(model: Path, out: Path, calib: Path | None, force: bool) -> ModelDir:
    """The model and the output (the options checked themselves: QuantizeOptions)."""
    src = ModelDir.open(model)
    src.require_weights()
    if src.quantization_config:
        qm = src.quantization_config.get("quant_method", "unknown")
        raise IncompatibleError(
            f"{src.path} is already quantized ({qm})",
            hint="Quantize the bf16/fp16 model it was made from.",
        )
    check_output_path(Path(out), force=force, inputs=[src.path, *([calib] if calib else [])])
    return src


def _finish_output(src: ModelDir, out: Path) -> str:
    """Add what the tools left out (tokenizer, chat template, generation config); check the format."""
    for f in [*(src.path / n for n in TOKENIZER_FILES), src.path / GENERATION_CONFIG]:
        if f.is_file() and not (out / f.name).exists():
            copy_file(f, out / f.name)
    try:
        config = json.loads((out / "config.json").read_text(encoding="utf-8"))
        qc = config["quantization_config"]
    except (OSError, ValueError, KeyError) as exc:
        raise ExternalToolError(
            "llm-compressor wrote no quantization_config into config.json",
            hint="Rerun with -v to see its log.", tool="llm-compressor",
        ) from exc
    return str(qc.get("format") or "")
