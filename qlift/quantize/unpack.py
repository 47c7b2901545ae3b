"""A pack-quantized (W4A16, W8A16) checkpoint's own quantized weights as plain float weights, for vLLM where its
CPU kernels have no ``cpu_gemm_wna16`` (AVX2-only hosts, qlift.cpu_support).

Each packed linear is ``weight_packed`` (int32 words, ``32 // bits`` values each, lowest bits first, stored with
an offset of ``2**(bits-1)``), ``weight_scale`` (one per row and group), ``weight_zero_point`` (asymmetric: packed
the same way along the rows) and ``weight_shape``; optional ``weight_g_idx`` maps each column to its group. The
float weight is ``(q - zero_point) * scale``, compressed-tensors' own ``dequantize``: the values the W4A16 kernel
multiplies with. For 4 and 8 bits compressed-tensors 0.17 (vLLM's) and 0.19 (llm-compressor's) pack alike; other
widths differ between them and are not unpacked. Read with safetensors (no pickle); written once per checkpoint
content hash and dtype under the cache dir, atomically, with a lineage manifest naming the source.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlift.errors import BadInputError
from qlift.fsutil import atomic_output_dir, copy_file, file_lock, write_json_atomic
from qlift.lineage import MANIFEST_NAME, utc_now, write_manifest
from qlift.models.ref import ModelRef

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")
INDEX = "model.safetensors.index.json"
NOT_COPIED = {"config.json", INDEX, MANIFEST_NAME, "recipe.yaml"}  # recipe.yaml: llm-compressor's, for the packed
FLOAT_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class PackedScheme:
    num_bits: int
    format: str = "pack-quantized"

    @property
    def label(self) -> str:
        """As a user names it: "W4A16"."""
        return f"W{self.num_bits}A16"


def packed_scheme(quantization_config: dict[str, Any] | None) -> PackedScheme | None:
    """The pack-quantized weight-only int scheme of a compressed-tensors ``quantization_config``; None for anything
    this module cannot unpack exactly (other formats and widths, activations quantized, sparsity, transforms,
    a quantized KV cache)."""
    q = quantization_config or {}
    if q.get("quant_method") != "compressed-tensors" or any(
            q.get(k) for k in ("sparsity_config", "transform_config", "kv_cache_scheme")):
        return None
    bits: set[int] = set()
    for group in (q.get("config_groups") or {}).values():
        group = group or {}
        w = group.get("weights") or {}
        if ((group.get("format") or q.get("format")) != "pack-quantized" or w.get("type") != "int"
                or group.get("input_activations") or w.get("strategy") not in ("group", "channel")
                or w.get("num_bits") not in (4, 8)):
            return None
        bits.add(int(w["num_bits"]))
    return PackedScheme(bits.pop()) if len(bits) == 1 else None


def unpack_int32(packed: torch.Tensor, num_bits: int, length: int, dim: int = 1) -> torch.Tensor:
    """The signed ints (int16) packed along ``dim`` of ``packed`` (``length`` of them: the rest is padding)."""
    import torch

    words = (packed.T if dim == 0 else packed).contiguous()
    # Read as bytes: on a little-endian host a word's value i (lowest bits first) is in byte i // (8 // num_bits),
    # low nibble first; byte-wide ops are several times faster than shifting every value out of its int32.
    assert sys.byteorder == "little"
    raw = words.view(torch.uint8)
    if num_bits == 4:
        raw = torch.stack((raw & 0xF, raw >> 4), dim=-1).reshape(words.shape[0], -1)
    values = raw[:, :length].to(torch.int16) - (1 << (num_bits - 1))
    return values.T if dim == 0 else values


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None,
               g_idx: torch.Tensor | None = None) -> torch.Tensor:
    """``(q - zero_point) * scale`` per row and group, in float32: exact (an int of at most 8 bits times a bf16 or
    fp16 scale fits float32's mantissa), so casting it to the scale's dtype is compressed-tensors' result."""
    import torch

    rows, cols = q.shape
    groups = scale.shape[-1]
    scale = scale.reshape(rows, groups).float()
    zero = None if zero_point is None else zero_point.reshape(rows, groups).float()
    size = math.ceil(cols / groups)
    if (g_idx is None or bool((g_idx < 0).any())) and size * groups == cols:  # columns in order: no gather
        w = q.reshape(rows, groups, size).float()
        if zero is not None:
            w -= zero.unsqueeze(-1)
        w *= scale.unsqueeze(-1)
        return w.reshape(rows, cols)
    group = g_idx.long() if g_idx is not None and not bool((g_idx < 0).any()) else torch.arange(cols) // size
    w = q.float()
    if zero is not None:
        w -= zero[:, group]
    return w * scale[:, group]


class _Tensors:
    """Every tensor of a checkpoint's safetensors files by name, read on demand (memory-mapped)."""

    def __init__(self, files: list[Path], stack: contextlib.ExitStack) -> None:
        from safetensors import safe_open

        self.files = files
        self.where: dict[str, Any] = {}
        self.names: dict[Path, list[str]] = {}
        for f in files:
            handle = stack.enter_context(safe_open(str(f), framework="pt"))
            self.names[f] = list(handle.keys())
            self.where.update(dict.fromkeys(self.names[f], handle))

    def get(self, name: str) -> torch.Tensor | None:
        handle = self.where.get(name)
        return None if handle is None else handle.get_tensor(name)


def _linear(t: _Tensors, module: str, num_bits: int) -> torch.Tensor:
    import torch

    shape = t.get(f"{module}.weight_shape")
    scale = t.get(f"{module}.weight_scale")
    packed = t.get(f"{module}.weight_packed")
    if shape is None or scale is None or packed is None:
        raise BadInputError(f"the packed linear {module} has no weight_shape or weight_scale",
                            hint="The checkpoint is incomplete: quantize it again.")
    rows, cols = (int(x) for x in shape.tolist())
    zero = t.get(f"{module}.weight_zero_point")
    if zero is not None and zero.dtype == torch.int32:
        zero = unpack_int32(zero, num_bits, rows, dim=0)  # asymmetric zero points: packed along the rows
    return dequantize(unpack_int32(packed, num_bits, cols), scale, zero, t.get(f"{module}.weight_g_idx"))


def unpack_into(src: Path, out: Path, *, scheme: PackedScheme, dtype: str) -> int:
    """Write ``src``'s weights, unpacked and in ``dtype``, into the existing directory ``out``, with its config
    (minus ``quantization_config``) and its other files; returns how many linears were unpacked."""
    import torch
    from safetensors.torch import save_file

    from qlift.models.modeldir import ModelDir

    md = ModelDir.open(src)
    md.require_weights()
    target = getattr(torch, dtype)
    unpacked = 0
    weight_map: dict[str, str] = {}
    total = 0
    with contextlib.ExitStack() as stack:
        t = _Tensors(md.safetensors_files, stack)
        packed = {n.removesuffix(".weight_packed") for n in t.where if n.endswith(".weight_packed")}
        if not packed:
            raise BadInputError(f"{src}'s config says {scheme.label}, but its weights hold no packed linear "
                                "(*.weight_packed)", hint="The checkpoint is incomplete: quantize it again.")
        for f in t.files:
            tensors: dict[str, torch.Tensor] = {}
            for name in t.names[f]:
                module, _, part = name.rpartition(".")
                if module in packed and part in PARTS:
                    if part == "weight_packed":
                        tensors[f"{module}.weight"] = _linear(t, module, scheme.num_bits).to(target)
                        unpacked += 1
                    continue
                x = t.get(name)
                assert x is not None
                tensors[name] = x.to(target) if x.is_floating_point() else x
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / f.name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, f.name))
            total += sum(v.numel() * v.element_size() for v in tensors.values())
    if (src / INDEX).is_file():
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        write_json_atomic(out / INDEX, index)
    config = dict(md.config)
    config.pop("quantization_config", None)
    config["torch_dtype" if "torch_dtype" in config and "dtype" not in config else "dtype"] = dtype
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        if p.is_file() and p.suffix != ".safetensors" and rel.as_posix() not in NOT_COPIED:
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            copy_file(p, out / rel)
    return unpacked


def unpacked_dir(ref: ModelRef, dtype: str) -> Path:
    """Where ``ref``'s unpacked weights in ``dtype`` live: the cache, by the checkpoint's content hash."""
    from qlift.settings import cache_dir

    return cache_dir() / "unpacked" / f"{ref.content_hash.removeprefix('sha256:')[:16]}-{dtype}"


def ensure_unpacked(ref: ModelRef, *, dtype: str) -> Path:
    """``ref``'s checkpoint unpacked to ``dtype`` float weights (a model directory vLLM loads as a plain model):
    from the cache when there, else written once (other processes wait on a lock, then read it)."""
    from qlift.models.modeldir import ModelDir

    if dtype not in FLOAT_DTYPES:
        raise BadInputError(f"cannot unpack to {dtype}", hint=f"Choose one of: {', '.join(FLOAT_DTYPES)}.")
    target = unpacked_dir(ref, dtype)
    if (target / MANIFEST_NAME).is_file():
        return target
    src = Path(ref.base)
    scheme = packed_scheme(ModelDir.open(src).quantization_config)
    if scheme is None:
        raise BadInputError(f"{src} is not a pack-quantized W4A16 or W8A16 checkpoint, so it cannot be unpacked",
                            hint="Only compressed-tensors pack-quantized int4/int8 weights (qlift quantize --awq) "
                                 "unpack into float weights.")
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{target.name}.lock"):
        if (target / MANIFEST_NAME).is_file():
            return target
        if target.exists():  # a leftover without a manifest is incomplete
            shutil.rmtree(target)
        started, t0 = utc_now(), time.monotonic()
        with atomic_output_dir(target, inputs=[src]) as tmp:
            count = unpack_into(src, tmp, scheme=scheme, dtype=dtype)
            write_manifest(tmp, operation="unpack", inputs={"model": src}, started_at=started, parameters={
                "unpacked_from": f"{scheme.label} ({scheme.format})", "dtype": dtype, "linears": count,
                "source_content_hash": ref.content_hash,
                "note": f"unpacked from {scheme.label}: (q - zero_point) * scale of the checkpoint's own weights"})
    log.info("unpacked the %s weights of %s to %s in %.1f s: %s", scheme.label, src, dtype,
             time.monotonic() - t0, target)
    return target
