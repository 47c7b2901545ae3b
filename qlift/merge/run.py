"""merge_model: validate, plan, stream the shards, carry the serving files, verify, record lineage.

``run(MergeInputs, MergeOptions) -> MergeResult`` is the stage's entry point (the shape every stage shares)."""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, ExternalToolError, GateFailedError, IncompatibleError, QliftError
from qlift.fsutil import FileHashes, atomic_output_dir, check_output_path
from qlift.lineage import read_manifest, recorded_hashes, utc_now, write_manifest
from qlift.loaders import read_json_object, validated
from qlift.merge.adapter import PICKLE_NAME, SAFE_NAME, Adapter, load_adapter
from qlift.merge.options import MergeOptions, parse_size
from qlift.merge.plan import LM_HEAD, Plan, build_plan, updated_config
from qlift.merge.verify import VerifyResult
from qlift.models.configs import GenerationConfig
from qlift.models.dtypes import CODE_OF_NAME, FLOAT_CODES, TORCH_NAMES
from qlift.models.modeldir import GENERATION_CONFIG, INDEX_NAME, TOKENIZER_FILES, ModelDir
from qlift.models.ref import ModelRef

log = logging.getLogger(__name__)

# --dtype: safetensors code and torch name of each choice
DTYPES = {flag: (CODE_OF_NAME[name], name) for flag, name in (("bf16", "bfloat16"), ("fp16", "float16"),
                                                               ("fp32", "float32"))}
VERIFY_MAX_PARAMS = 2_000_000_000


@dataclass
class MergeResult:
    output: Path
    base: Path
    adapters: list[Path]
    dtype: str
    shards: list[str]
    tensors: int
    modified_tensors: int
    adapter_modules: int
    vocab_size: int | None
    tie_word_embeddings: bool
    bytes_read: int
    bytes_written: int
    total_size: int
    wall_s: float
    peak_rss_bytes: int
    tokenizer_from: Path
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    verify: VerifyResult | None = None
    verify_not_run: str | None = None  # why a --verify that was on could not compare (the merge stands)
    model_ref: ModelRef | None = None  # the output, hashed once (from the qlift.json it was written with)


def _base_matches(adapter: Adapter, base: ModelDir) -> bool:
    name = adapter.base_name
    if not name:
        return True
    if name.rstrip("/").rsplit("/", 1)[-1] == base.path.resolve().name:
        return True
    try:  # a hub id, or a path on the machine it was trained on: anything may be written here
        local = Path(name).expanduser()
        if local.exists() and local.resolve() == base.path.resolve():
            return True
    except (OSError, RuntimeError, ValueError):
        pass
    manifest = read_manifest(base.path)
    return bool(manifest and name in json.dumps(manifest))


def _tokenizer_source(base: ModelDir, adapters: list[Adapter]) -> Path:
    for a in reversed(adapters):  # a fine-tune that changed its tokenizer saves it beside the adapter
        if any((a.path / n).is_file() for n in TOKENIZER_FILES):
            return a.path
    return base.path


def _generation_config(base: ModelDir, adapters: list[Adapter]) -> Path | None:
    """The generation_config.json the output carries (the last adapter's that has one, else the base's),
    checked now: an invalid one is refused before any work rather than copied for vLLM to trip on."""
    gen = next((a.path / GENERATION_CONFIG for a in reversed(adapters) if (a.path / GENERATION_CONFIG).is_file()),
               base.path / GENERATION_CONFIG)
    if not gen.is_file():
        return None
    validated(GenerationConfig, read_json_object(gen), path=gen,
              hint="Fix it, or delete it to keep the base model's generation settings.")
    return gen


def _carry_files(tok_dir: Path, gen: Path | None, out: Path) -> None:
    for n in TOKENIZER_FILES:
        if (tok_dir / n).is_file():
            shutil.copyfile(tok_dir / n, out / n)
    if gen is not None:
        shutil.copyfile(gen, out / GENERATION_CONFIG)


def _check_base(base: ModelDir) -> None:
    if base.quantization_config:
        method = base.quantization_config.get("quant_method", "quantized")
        raise IncompatibleError(f"base model {base.path} is {method}-quantized; LoRA merges need full weights",
                                hint="Merge into the unquantized base, then quantize the merged model.")
    if not base.safetensors_files:
        if base.pickle_files:
            raise IncompatibleError(f"base model {base.path} has only pickle weights; merge streams safetensors",
                                    hint="Convert the base to safetensors first.")
        base.require_weights()


def _dtype(base: ModelDir, dtype: str) -> tuple[str | None, str]:
    if dtype in DTYPES:
        return DTYPES[dtype]
    if dtype != "auto":
        raise BadInputError(f"unknown dtype {dtype!r}", field="--dtype", hint="Use auto, bf16, fp16 or fp32.")
    name = base.torch_dtype
    if not name:
        counts = {k: v for k, v in base.weight_dtypes.items() if k in FLOAT_CODES}
        name = TORCH_NAMES[max(counts, key=counts.__getitem__)] if counts else "float32"
    return None, str(name)


def _cores() -> int:
    """CPUs this process may run on (taskset and container limits included)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class _Run:
    """What merge_model settles before the work starts."""

    base: ModelDir
    st_dtype: str | None  # None: keep each tensor's dtype
    dtype_name: str
    shard_bytes: int
    t0: float
    started: str
    input_hasher: FileHashes


@dataclass(frozen=True)
class MergeInputs:
    """What a merge consumes: the base model, its LoRA adapters (applied in order), and where the result goes.
    ``base`` is a ``ModelRef``: its adapters, if it carries any, are applied before ``adapters``."""

    base: ModelRef
    adapters: list[Path]
    output: Path


def run(inputs: MergeInputs, options: MergeOptions) -> MergeResult:
    """The merge stage's entry point: ``merge_model`` on ``inputs`` as ``options`` say."""
    carried = [a.path for a in inputs.base.adapters]
    return merge_model(base=inputs.base.base, adapters=carried + list(inputs.adapters), out=inputs.output,
                       options=options)


def merge_model(*, base: Path, adapters: list[Path], out: Path, options: MergeOptions | None = None,
                **overrides: Any) -> MergeResult:
    """Merge LoRA ``adapters`` (in order) into ``base`` and write the merged model to ``out``.

    ``options`` (or ``MergeOptions`` field names as keywords, e.g. ``verify=False``) say how."""
    opts = replace(options or MergeOptions(), **overrides)
    dtype, max_shard_size, device, force = opts.dtype, opts.max_shard_size, opts.device, opts.force
    t0 = time.perf_counter()
    started = utc_now()
    if not adapters:
        raise BadInputError("no adapter given", hint="Pass at least one adapter directory after BASE.")
    out = Path(out)
    check_output_path(out, force=force, inputs=[base, *adapters])
    shard_bytes = parse_size(max_shard_size)
    mdir = ModelDir.open(base)
    _check_base(mdir)
    st_dtype, dtype_name = _dtype(mdir, dtype)
    # Hash the base shards for the lineage manifest on a thread of their own, from now on
    # (overlapping the torch import and the merge); digests a manifest of the base already
    # records for unchanged files are reused instead.
    known = recorded_hashes(mdir.path)
    to_hash = [mdir.path / f for f in sorted(mdir.tensors_by_file()) if f not in known]
    for a in adapters:
        known = recorded_hashes(Path(a))
        to_hash += [Path(a) / n for n in (SAFE_NAME, PICKLE_NAME) if (Path(a) / n).is_file() and n not in known]
    input_hasher = FileHashes(to_hash, threads=max(1, _cores() - 1))
    try:
        if device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise IncompatibleError("--device cuda was given but torch sees no CUDA GPU", hint="Use --device cpu.")
        run = _Run(mdir, st_dtype, dtype_name, shard_bytes, t0, started, input_hasher)
        return _merge(run, adapters, out, opts)
    finally:
        input_hasher.cancel()


def _merge(run: _Run, adapters: list[Path], out: Path, opts: MergeOptions) -> MergeResult:
    mdir, st_dtype, dtype_name, t0 = run.base, run.st_dtype, run.dtype_name, run.t0
    verify, tolerance, strict, allow_pickle = opts.verify, opts.tolerance, opts.strict, opts.allow_pickle
    force, device, max_shard_size = opts.force, opts.device, opts.max_shard_size
    shard_bytes, started, input_hasher = run.shard_bytes, run.started, run.input_hasher
    loaded = [load_adapter(Path(a), allow_pickle=allow_pickle) for a in adapters]
    warnings: list[str] = []
    strangers = [a for a in loaded if not _base_matches(a, mdir)]
    for a in strangers:
        msg = f"adapter {a.path} was trained on {a.base_name!r}, not obviously {mdir.path}"
        if strict:
            raise IncompatibleError(msg, hint="Pass the matching base, or drop --strict to merge anyway.")
        warnings.append(msg)
    try:
        plan = build_plan(mdir, loaded, out_dtype=st_dtype)
    except IncompatibleError as exc:
        if strangers:  # the likely cause, in the same one line
            exc.hint = f"The adapter names {strangers[0].base_name!r} as its base; merge it into that model."
        raise
    for msg in warnings:
        log.warning(msg)
    tok_dir = _tokenizer_source(mdir, loaded)
    tok_len = ModelDir(tok_dir).tokenizer_length
    if plan.vocab_rows is not None and tok_len is not None and tok_len > plan.vocab_rows:
        raise IncompatibleError(
            f"the tokenizer in {tok_dir} has {tok_len} tokens but the merged embeddings only {plan.vocab_rows} rows",
            hint="The adapter must save its resized embeddings (peft save_embedding_layers=True).")
    gen_config = _generation_config(mdir, loaded)
    if verify is None:
        verify = mdir.parameter_count < VERIFY_MAX_PARAMS
    files = sorted(mdir.tensors_by_file())
    changed = sum(bool(e.steps) for e in plan.entries.values())
    log.info("merge: %d tensors, %d of them changed by %d adapter modules; writing the shards", len(plan.entries),
             changed, plan.targets)
    with atomic_output_dir(out, force=force, inputs=[mdir.path, *(a.path for a in loaded)]) as tmp:
        from qlift.merge.writer import write_shards

        t1 = time.perf_counter()
        written = write_shards(plan, base_dir=mdir.path, base_files=files, out_dir=tmp,
                               max_shard_bytes=shard_bytes, device=device, cores=_cores())
        log.debug("shards written and hashed in %.2f s", time.perf_counter() - t1)
        config = updated_config(mdir.config, plan, dtype_name)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        index = {"metadata": {"total_size": written.total_size}, "weight_map": dict(sorted(written.weight_map.items()))}
        (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        _carry_files(tok_dir, gen_config, tmp)
        log.info("merge: shards written, %.0f s in", time.perf_counter() - t0)
        if verify:
            log.info("merge: verifying against peft (loads the base with the adapters, and the merge; "
                     "--no-verify skips it)")
        checked, not_run = _verify(mdir, loaded, plan, tmp, tolerance, asked=opts.verify is True) if verify \
            else (None, None)
        if checked is not None:
            log.info("merge: verified, %.0f s in", time.perf_counter() - t0)
        if checked is not None and checked.inputs != "chat prompts":
            plan.notes.append(f"--verify compared logits on {checked.inputs}: the model has no tokenizer qlift could "
                              "load")
        inputs: dict[str, Path] = {"base": mdir.path}
        inputs.update({f"adapter{i + 1}" if len(loaded) > 1 else "adapter": a.path for i, a in enumerate(loaded)})
        params: dict[str, Any] = {"dtype": dtype_name, "max_shard_size": max_shard_size, "device": device,
                                  "adapters": [str(a.path) for a in loaded], "verify": checked is not None}
        t1 = time.perf_counter()
        if not input_hasher.done():
            log.info("merge: hashing the inputs for the lineage manifest")
        input_hashes = input_hasher.result()
        log.debug("inputs hashed, %.2f s after the rest", time.perf_counter() - t1)
        manifest = write_manifest(tmp, operation="merge", inputs=inputs, parameters=params, started_at=started,
                       precomputed=written.hashes | input_hashes)
    return MergeResult(
        output=out, base=mdir.path, adapters=[a.path for a in loaded], dtype=dtype_name, shards=written.files,
        tensors=len(plan.entries), modified_tensors=written.modified, adapter_modules=plan.targets,
        vocab_size=plan.vocab_rows, tie_word_embeddings=mdir.tie_word_embeddings and not plan.untied,
        bytes_read=written.bytes_read, bytes_written=written.bytes_written, total_size=written.total_size,
        wall_s=time.perf_counter() - t0,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, tokenizer_from=tok_dir,
        notes=plan.notes, warnings=warnings, verify=checked, verify_not_run=not_run,
        model_ref=ModelRef.written(out, manifest.outputs),
    )


def _verify(mdir: ModelDir, loaded: list[Adapter], plan: Plan, merged: Path, tolerance: float, *,
            asked: bool) -> tuple[VerifyResult | None, str | None]:
    """The comparison with peft, or (None, why) where it could not run and ``asked`` (--verify given) is off:
    then the merge stands, unverified, with one warning line. A comparison that ran and differs always fails."""
    from qlift.merge.verify import verify_merge

    ref_merged = bool(plan.tied and plan.embed_name and plan.entries[plan.embed_name].steps)
    # A resized vocabulary: the adapter saved its embeddings or head whole, with as many rows as it has tokens.
    rows = [max((a.replacements[n].shape[0] for n in (plan.embed_name, LM_HEAD) if n in a.replacements),
                default=None) for a in loaded]
    try:
        r = verify_merge(base=mdir.path, adapters=[a.path for a in loaded], merged=merged, tolerance=tolerance,
                         reference_merged=ref_merged, vocab_rows=rows)
    except QliftError:
        raise
    except Exception as exc:  # noqa: BLE001  (transformers or peft could not load or run a model: say which)
        why = f"transformers or peft failed ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]})"
        if asked:
            raise ExternalToolError(f"--verify could not run: {why}; nothing was written", tool="peft",
                                    hint="Rerun with --no-verify to write the merge unverified.") from None
        log.warning("--verify was not run: %s; the merge is written unverified", why)
        return None, why
    if not r.passed:
        raise GateFailedError(
            f"merged logits differ from peft's by {r.max_abs_logit_delta:.4g} "
            f"({r.relative_delta:.2%} of the largest logit, tolerance {tolerance:.2%}); nothing was written",
            hint="Check the adapter and base match, or rerun with --no-verify to keep the output anyway.")
    return r, None
