"""Engine arguments for an offline vLLM engine, from the same recipes ``qlift serve`` uses."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlift.hardware import Hardware, detect
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
    threads: int | None = None  # torch threads of an in-process engine (see in_process_threads)


def engine_for(model: Path, *, recipe: str = "auto", workload: str = "batch", sets: list[str] | None = None,
               hardware: Hardware | None = None, in_process: bool = False) -> EngineChoice:
    """Resolve a recipe (auto: the best for this machine) and ``--set`` overrides; refuse what cannot fit.

    ``in_process``: where ``in_process_threads`` allows it, run the engine in the caller's process."""
    md = ModelDir.open(model)
    md.require_weights()
    hw = hardware or detect()
    chosen = choose_recipe(hw, workload=workload, model=md).recipe if recipe == "auto" else load_recipe(recipe)
    chosen, notes = fit_to_model(apply_overrides(chosen, sets or []), md)
    plan = plan_memory(md, chosen, hw)
    check_plan(plan)
    args = chosen.engine.args()
    args["dtype"] = plan.dtype  # the plan resolved "auto" (float32 on a CPU without bf16 units)
    env = {k: v for k, v in chosen.env.items() if k not in os.environ}
    threads = in_process_threads(args, env, hw) if in_process else None
    if threads is not None:
        args["distributed_executor_backend"] = "uni"
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        notes = [*notes, f"engine in the worker's process ({threads} compute thread(s)), not in two spawned ones"]
    else:  # the cpu recipe's MULTIPROCESSING=0 is for servers; offline it would fold the engine in unasked
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    return EngineChoice(chosen, args, env, plan, hw, notes + plan.notes, threads)


def in_process_threads(args: dict[str, Any], env: dict[str, str], hw: Hardware) -> int | None:
    """Torch threads for an engine run in the caller's process, or None to keep vLLM's processes.

    On the CPU, vLLM spawns two fresh interpreters for one engine (its engine core, then the core's
    model worker), and each imports torch and vLLM again: 13-25 s of a ~1 minute batch run on
    2 cores, every run. With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and the ``uni`` executor both run
    in the caller's process instead. The compute threads stay what vLLM's own binding gives its
    worker (every core but one, which it keeps for its scheduler), so generation speed is the
    same (measured: 48 s vs 47-51 s for 256 chats on 2 cores); all cores ran faster on a quiet
    machine but 3-4x slower beside one other busy process. Not on GPUs (vLLM overlaps scheduling
    with the GPU there), not for more than one device, and not where the user pinned vLLM's
    processes themselves (VLLM_CPU_OMP_THREADS_BIND, VLLM_ENABLE_V1_MULTIPROCESSING).
    """
    if hw.gpus or any(int(args.get(k) or 1) > 1 for k in ("tensor_parallel_size", "pipeline_parallel_size")):
        return None
    if args.get("distributed_executor_backend") not in (None, "uni"):
        return None
    chosen = {**env, **os.environ}  # the cpu recipe's own VLLM_ENABLE_V1_MULTIPROCESSING=0 is this choice, not a pin
    if chosen.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto" or "VLLM_ENABLE_V1_MULTIPROCESSING" in os.environ:
        return None
    return max(1, hw.cpu.cores - 1)
