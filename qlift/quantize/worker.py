"""The llm-compressor side of ``qlift quantize``; runs inside the quantize tool environment.

    <env>/bin/python -m qlift.quantize.worker JOB.json

stdout carries JSON lines only: ``{"event": "progress" | "result" | "error", ...}``.
Everything llm-compressor, transformers and tqdm print is moved to stderr, which the
parent keeps in a log file. Imports only qlift's pure-Python modules besides the tools.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from qlift.errors import IncompatibleError, QliftError
from qlift.fsutil import FileHashes
from qlift.quantize.calib import DEFAULTS
from qlift.quantize.groups import ALWAYS_IGNORED, choose_group_size, matches

Emit = Callable[..., None]


def _json_channel() -> TextIO:
    """Keep the real stdout for JSON lines; point fd 1 (and sys.stdout) at stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1, encoding="utf-8")


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise IncompatibleError(
            "--device cuda was given but the tool environment's torch sees no CUDA device",
            hint="Use --device cpu (or auto), or install a CUDA build of torch in the parent environment.",
        )
    return requested


def _no_pin_memory_without_accelerator() -> None:
    """AWQ pins cached activations for faster GPU onloading; on a CPU-only torch that raises
    "Cannot access accelerator device when none is available", so skip pinning there."""
    from llmcompressor.pipelines.cache import IntermediatesCache

    IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None  # type: ignore[method-assign]


def _report_layers(emit: Emit) -> None:
    """One progress event per calibrated decoder layer: llm-compressor only draws tqdm bars.

    Wraps two of its internals; if they move in another version there is just no per-layer
    progress, so failures here are ignored.
    """
    try:
        from llmcompressor.core import LifecycleCallbacks
        from llmcompressor.pipelines.sequential import pipeline as seq

        counts: dict[str, int] = {"done": 0, "total": 0}
        trace, epoch_end = seq.trace_subgraphs, LifecycleCallbacks.sequential_epoch_end.__func__

        def counting_trace(*args: Any, **kwargs: Any) -> Any:
            subgraphs = trace(*args, **kwargs)
            counts["total"] = len(subgraphs)
            return subgraphs

        def reporting_end(cls: Any, *args: Any, **kwargs: Any) -> Any:
            result = epoch_end(cls, *args, **kwargs)
            if counts["done"] < counts["total"]:  # it may fire once more after the last layer
                counts["done"] += 1
                emit("progress", stage="layers", step=counts["done"], total=counts["total"])
            return result

        seq.trace_subgraphs = counting_trace  # type: ignore[assignment]
        LifecycleCallbacks.sequential_epoch_end = classmethod(reporting_end)  # type: ignore[method-assign,assignment]
    except (ImportError, AttributeError):
        return


def _calibration_dataset(records: list[dict[str, Any]], tokenizer: Any, num: int, seq_len: int) -> Any:
    from datasets import Dataset

    rows = []
    for rec in records[:num]:
        if "messages" in rec and tokenizer.chat_template:
            text = tokenizer.apply_chat_template(rec["messages"], tokenize=False)
        elif "messages" in rec:
            text = "\n\n".join(m["content"] for m in rec["messages"])
        else:
            text = rec["text"]
        enc = tokenizer(text, truncation=True, max_length=seq_len, add_special_tokens=False)
        rows.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    return Dataset.from_list(rows)


def run_awq(job: dict[str, Any], emit: Emit) -> dict[str, Any]:
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(job["device"])
    if device == "cpu" and job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    if not torch.cuda.is_available():
        _no_pin_memory_without_accelerator()
    num, seq_len = DEFAULTS[device]
    num = min(job.get("num_samples") or num or len(job["calibration"]), len(job["calibration"]))
    seq_len = job.get("seq_len") or seq_len

    emit("progress", stage="load", message=f"loading {job['model']}")
    compute_dtype = job.get("compute_dtype") or "auto"
    if device != "cpu" or compute_dtype == "auto":
        compute_dtype = "auto"
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=compute_dtype)
    stored_dtype = AutoConfig.from_pretrained(job["model"]).dtype
    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    ignore = [*ALWAYS_IGNORED, *job["ignore"]]
    in_features = {
        name: mod.in_features
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and not matches(name, ignore)
    }
    group = choose_group_size(in_features, job.get("group_size"))
    dataset = _calibration_dataset(job["calibration"], tokenizer, num, seq_len)
    weights = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": group}
    recipe = [
        AWQModifier(duo_scaling=True),
        QuantizationModifier(config_groups={"group_0": {"targets": ["Linear"], "weights": weights}},
                             ignore=ignore),
    ]
    model_dtype = str(model.dtype).removeprefix("torch.")
    on = f"{device}, {model_dtype}" + (f", {torch.get_num_threads()} threads" if device == "cpu" else "")
    emit("progress", stage="calibrate", message=f"AWQ W4A16 group {group} on {on}: {num} samples x {seq_len} tokens")
    _report_layers(emit)
    t0, cpu0 = time.monotonic(), time.process_time()
    oneshot(model=model, dataset=dataset, recipe=recipe, max_seq_length=seq_len,
            num_calibration_samples=num, shuffle_calibration_samples=False)
    calib_s, calib_cpu_s = time.monotonic() - t0, time.process_time() - cpu0
    if isinstance(stored_dtype, torch.dtype) and model.dtype != stored_dtype:
        # Calibrated in float32 for speed: scales and zero points go out in the model's own dtype.
        torch.nn.Module.to(model, stored_dtype)
        model.config.dtype = stored_dtype
    emit("progress", stage="save", message="writing the compressed-tensors checkpoint")
    model.save_pretrained(job["output"], save_compressed=True)
    tokenizer.save_pretrained(job["output"])
    return {"device": device, "group_size": group, "num_samples": num, "seq_len": seq_len,
            "ignore": ignore, "calibration_seconds": round(calib_s, 2),
            "calibration_cpu_seconds": round(calib_cpu_s, 2), "compute_dtype": model_dtype,
            "threads": torch.get_num_threads()}


def _hash_saved_shards(hashes: FileHashes, written: dict[str, tuple[int, int]]) -> None:
    """Hash every file model_free_ptq saves right after it saves it (the bytes are still in the page cache, and
    the next shard is being quantized meanwhile), so the parent's lineage manifest does not read gigabytes again;
    ``written`` gets each file's (size, mtime) as saved, what its digest belongs to. model_free_ptq calls
    ``save_file`` from its own module; if a later llm-compressor moves that, nothing is hashed here and the parent
    hashes the output afterwards."""
    try:
        from llmcompressor.entrypoints import model_free
    except ImportError:
        return
    save = getattr(model_free, "save_file", None)
    if save is None:
        return

    def save_and_hash(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
        result = save(tensors, filename, *args, **kwargs)
        path = Path(filename).resolve()
        st = path.stat()
        written[str(path)] = (st.st_size, st.st_mtime_ns)
        hashes.add(path)
        return result

    model_free.save_file = save_and_hash


def run_fp8(job: dict[str, Any], emit: Emit) -> dict[str, Any]:
    from llmcompressor import model_free_ptq

    device = resolve_device(job["device"])
    if device == "cpu" and job.get("threads"):
        import torch

        torch.set_num_threads(int(job["threads"]))
    # Embeddings too: on a tied model model_free_ptq would otherwise quantize embed_tokens,
    # and vLLM refuses such a checkpoint (no parameter 'embed_tokens.weight_scale').
    ignore = [*ALWAYS_IGNORED, *job["embeddings"], *job["ignore"]]
    emit("progress", stage="quantize", message=f"FP8 dynamic on {device}, streaming shards")
    hashes = FileHashes([], int(job.get("hash_threads") or 1), more=True)
    written: dict[str, tuple[int, int]] = {}
    _hash_saved_shards(hashes, written)
    model_free_ptq(model_stub=job["model"], save_directory=job["output"], scheme="FP8_DYNAMIC",
                   ignore=ignore, device=device)
    digests = hashes.result()
    return {"device": device, "ignore": ignore,
            "written_hashes": {p: [digests[p], *written[p]] for p in digests}}


def run(job: dict[str, Any], emit: Emit) -> dict[str, Any]:
    import llmcompressor

    runner = {"awq": run_awq, "fp8": run_fp8}[job["method"]]
    t0 = time.monotonic()
    result = runner(job, emit)
    result["llmcompressor"] = llmcompressor.__version__
    result["worker_seconds"] = round(time.monotonic() - t0, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    chan = _json_channel()

    def emit(event: str, **data: Any) -> None:
        chan.write(json.dumps({"event": event, **data}) + "\n")
        chan.flush()

    try:
        job = json.loads(Path(args[0]).read_text(encoding="utf-8"))
        result = run(job, emit)
    except QliftError as exc:
        emit("error", qlift_error=type(exc).__name__, message=exc.message, hint=exc.hint)
        return 1
    except Exception as exc:
        traceback.print_exc()
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        kind = type(exc).__name__
        if type(exc).__module__ not in ("builtins", "__main__"):
            kind = f"{type(exc).__module__}.{kind}"
        emit("error", type=kind, message=message)
        return 1
    emit("result", **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
