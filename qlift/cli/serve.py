"""qlift serve, qlift plan, qlift recipes list/show."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from qlift.cli.options import click_options
from qlift.cli.output import STATE, emit, human_bytes, json_option
from qlift.options import field_docs
from qlift.serialize import to_jsonable
from qlift.serve.options import ServeOptions

if TYPE_CHECKING:
    from qlift.hardware import Hardware
    from qlift.serve.launch import LaunchSpec
    from qlift.serve.plan import MemoryPlan
    from qlift.serve.pool import PoolHandle, PoolSpec

_FIELDS = [f.name for f in dataclasses.fields(ServeOptions)]
_LORA = _FIELDS.index("loras")


def _only(*names: str) -> tuple[str, ...]:
    """The exclude= that leaves ``names``: ServeOptions' options a command takes, in field order."""
    return tuple(n for n in _FIELDS if n not in names)


_hardware_options = click_options(ServeOptions, exclude=_only("gpu", "gpus"))
_recipe_options = click_options(ServeOptions, exclude=_only("recipe", "workload", "sets"))


def _hardware(gpu: str | None, gpus: int | None) -> Hardware:
    from qlift.hardware import resolve

    return resolve(gpu, gpus)


def _print_plan(p: MemoryPlan, notes: list[str] | None = None) -> None:
    """The plan's figures, then ``notes`` (a launch's own and the plan's; the plan's alone by default)."""
    gib = human_bytes
    if p.device == "gpu":
        memory = f"{gib(p.memory_bytes)} x {p.gpu_memory_utilization:g} = {gib(p.budget_bytes)}"
    else:
        memory = f"{gib(p.memory_bytes)} RAM, serving needs {gib(p.budget_bytes)}"
    rows = [
        ("hardware", p.hardware),
        ("recipe", f"{p.recipe} (dtype {p.dtype}, kv cache {p.kv_cache_dtype}, tp {p.tensor_parallel_size})"),
        ("memory per GPU" if p.device == "gpu" else "memory", memory),
        ("weights", gib(p.weight_bytes)),
        ("activations", f"{gib(p.activation_bytes)} ({p.max_num_batched_tokens} tokens, {p.max_num_seqs} seqs)"),
        ("cuda graphs + runtime", f"{gib(p.cuda_graph_bytes)} + {gib(p.overhead_bytes)}"),
        ("kv cache", f"{gib(p.kv_cache_bytes)} = {p.kv_capacity_tokens:,} tokens "
                     f"({gib(p.kv_bytes_per_token)}/token)"),
        ("max_model_len", f"{p.max_model_len:,} -> {p.concurrent_sequences:g} sequences at once"),
    ]
    verdict: str = p.verdict  # a Verdict; the text row may add the largest length that fits
    if p.largest_max_model_len:
        verdict += f" (largest max_model_len that fits: {p.largest_max_model_len:,})"
    rows.append(("verdict", verdict))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k.ljust(width)}  {v}")
    for n in p.notes if notes is None else notes:
        click.echo(f"note: {n}", err=True)


@click.command("plan")
@click.argument("model", type=click.Path(path_type=Path))
@_recipe_options
@_hardware_options
@json_option
def plan_cmd(model: Path, recipe: str, workload: str, sets: tuple[str, ...], gpu: str | None,
             gpus: int | None) -> None:
    """Will MODEL fit? Memory plan for serving MODEL with a recipe, before launching anything.

    Weights come from the safetensors headers (quantized checkpoints count at their
    stored size), KV cache per token from config.json. The verdict is fits, low memory
    (with the largest max_model_len that fits) or does not fit.

    \b
    Examples:
      qlift plan ./merged --recipe chat-4090 --gpu "RTX 4090"
      qlift plan ./merged --recipe auto --gpu T4 --json
      qlift plan ./merged --recipe multi-tenant-a100x2 --gpu A100-40GB --gpus 2
      qlift plan ./merged -r chat-h100 --gpu H100 --set max_model_len=131072
    """
    from qlift.models.ref import ModelRef
    from qlift.serve.launch import plan_launch

    hw = _hardware(gpu, gpus)
    planned = plan_launch(ModelRef.at(model), recipe=recipe, hardware=hw, workload=workload, sets=list(sets))
    p = planned.memory
    p.notes[:0] = ([f"recipe auto: {planned.reason}"] if recipe == "auto" else []) + planned.notes
    emit(p, lambda: _print_plan(p))


@click.command("serve")
@click.argument("model", type=click.Path(path_type=Path))
@click_options(ServeOptions, exclude=_only(*_FIELDS[:_LORA]))
@click.option("--lora", "loras", multiple=True, metavar="NAME=DIR", help=field_docs(ServeOptions)["loras"])
@click_options(ServeOptions, exclude=_only(*_FIELDS[_LORA + 1:]))
@json_option
def serve_cmd(model: Path, loras: tuple[str, ...], **options: Any) -> None:
    """Serve MODEL with vLLM (OpenAI-compatible API) using a hardware-profiled recipe.

    Resolves the recipe (auto: the best one that fits this hardware and workload),
    applies --set overrides, prints the memory plan, writes the effective config as a
    `vllm serve --config` YAML into a run directory under $QLIFT_HOME/runs, starts
    `vllm serve` (so server arguments such as api_server_count work too), raises the
    open-files limit to the hard limit first, and waits for /health, showing vLLM's
    startup steps (weights, compile, KV cache, graph capture). Its log streams to
    stderr once it is up, without HTTP access lines (--access-log: with them; -v: the
    whole log from the start). Ctrl-C or SIGTERM lets in-flight requests finish (up
    to --drain seconds), then stops vLLM's whole process group.

    \b
    Examples:
      qlift serve ./smollm2 --recipe cpu --port 8000
      qlift serve ./merged --recipe auto --served-model-name support-bot
      qlift serve ./merged -r chat-4090 --set max_model_len=4096 --api-key-env MY_KEY
      qlift serve ./merged -r chat-h200 --set api_server_count=8
      qlift serve ./merged --recipe auto --gpu T4 --dry-run
      qlift serve ./smollm2 --recipe cpu --lora tickets=./adapters/tickets --lora-runtime
      qlift serve ./smollm2 --recipe cpu --replicas 2 --port 8000
    """
    from qlift.models.ref import ModelRef
    from qlift.serve.launch import prepare
    from qlift.serve.lora import parse_lora_flags

    opts = ServeOptions(loras=parse_lora_flags(loras), **options)
    if opts.dry_run and opts.replicas > 1:
        from qlift.serve.pool import prepare_pool

        pool = prepare_pool(ModelRef.at(model), opts, _hardware(opts.gpu, opts.gpus))
        emit(_dry_run_result(pool.front) | _pool_result(pool), lambda: _print_pool_dry_run(pool))
        return
    if opts.dry_run:
        spec = prepare(ModelRef.at(model), opts, _hardware(opts.gpu, opts.gpus))
        emit(_dry_run_result(spec), lambda: _print_dry_run(spec))
        return
    from qlift import serve
    from qlift.vllm.logview import LogView, PhaseLines

    def say(line: str) -> None:
        click.echo(line, err=True)

    phases = None if STATE.quiet or STATE.verbose else PhaseLines(say)  # -v shows the whole log instead
    view = LogView(write=None if STATE.quiet else _stderr_write, on_phase=phases, startup=STATE.verbose > 0,
                   access=opts.access_log, note=say)

    def starting(spec: LaunchSpec) -> None:
        n = spec.options.replicas
        logs = spec.run_dir / ("replica-*/vllm.log" if n > 1 else "vllm.log")
        say(f"starting {f'{n} vLLM servers' if n > 1 else 'vLLM'} with recipe {spec.recipe}; log: {logs}")
        if phases is not None:
            phases.began = time.monotonic()  # phase times count from vLLM's start

    def ready(spec: LaunchSpec, pid: int) -> None:
        if phases is not None:
            phases.close()
        _ready(spec, pid)

    def pool_ready(pool: PoolHandle) -> None:
        if phases is not None:
            phases.close()
        _pool_ready(pool)

    hooks = serve.ServeHooks(on_plan=lambda spec: None if STATE.json else _print_plan(spec.plan, spec.notes),
                             on_note=lambda note: say(f"note: {note}"), on_launch=starting, on_ready=ready, view=view,
                             on_pool_ready=pool_ready)
    outcome = serve.run(serve.ServeInputs(ModelRef.at(model)), opts, hooks=hooks)
    what = f"the pool of {opts.replicas} vLLM servers and vllm-router (pid" if opts.replicas > 1 else "vLLM (pid"
    click.echo(f"stopped {what} {outcome.pid}, process group) on {outcome.stopped_by} "
               f"in {outcome.stop_s:.1f} s", err=True)


def _stderr_write(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def _ready(spec: LaunchSpec, pid: int) -> None:
    info = {"status": "ready", "base_url": f"{spec.base_url}/v1", "model": spec.served_model_name,
            "pid": pid, "run_dir": str(spec.run_dir), "log": str(spec.run_dir / "vllm.log"),
            "model_ref": to_jsonable(spec.model_ref)}
    if STATE.json:  # one line, so a supervisor can read it while the server runs
        click.echo(json.dumps(info))
        sys.stdout.flush()
    else:
        click.echo(f"serving {spec.served_model_name} at {spec.base_url}/v1 (pid {pid}); Ctrl-C stops it")
        sys.stdout.flush()


def _pool_ready(pool: PoolHandle) -> None:
    spec = pool.spec
    replicas = [{"base_url": f"{m.spec.base_url}/v1", "pid": m.pid, "log": str(m.server.log_path),
                 "bound_to": s.text} for m, s in zip(pool.members, pool.spec_pool.shares, strict=True)]
    info = {"status": "ready", "base_url": f"{spec.base_url}/v1", "model": spec.served_model_name, "pid": pool.pid,
            "run_dir": str(spec.run_dir), "log": str(pool.router_log), "model_ref": to_jsonable(spec.model_ref),
            "router": {"pid": pool.pid, "policy": spec.options.router_policy, "log": str(pool.router_log),
                       "metrics_url": f"http://127.0.0.1:{pool.spec_pool.router_metrics_port}/metrics"},
            "replicas": replicas}
    if STATE.json:
        click.echo(json.dumps(info))
    else:
        click.echo(f"serving {spec.served_model_name} at {spec.base_url}/v1 (vllm-router pid {pool.pid}, policy "
                   f"{spec.options.router_policy}) over {len(replicas)} replicas; Ctrl-C stops them all")
        for i, r in enumerate(replicas):
            click.echo(f"  replica {i}: {r['base_url']} (pid {r['pid']}, {r['bound_to']}; log {r['log']})")
    sys.stdout.flush()


def _pool_result(pool: PoolSpec) -> dict[str, Any]:
    return {"router_argv": pool.router_argv, "replicas": [
        {"base_url": f"{r.base_url}/v1", "argv": r.argv, "env": r.env, "bound_to": s.text}
        for r, s in zip(pool.replicas, pool.shares, strict=True)]}


def _print_pool_dry_run(pool: PoolSpec) -> None:
    _print_dry_run(pool.front, argv=False)
    for i, (r, s) in enumerate(zip(pool.replicas, pool.shares, strict=True)):
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in s.env.items())
        click.echo(f"# replica {i} ({s.text}): {env} {shlex.join(r.argv)}")
    click.echo(f"# in front: {shlex.join(pool.router_argv)}")


def _dry_run_result(spec: LaunchSpec) -> dict[str, Any]:
    return {"argv": spec.argv, "command": shlex.join(spec.argv), "config": spec.config_yaml,
            "config_path": str(spec.run_dir / "config.yaml"), "recipe": spec.recipe,
            "recipe_reason": spec.recipe_reason, "env": spec.env,
            "api_key_env": spec.api_key_env, "plan": spec.plan, "notes": spec.notes, "model_ref": spec.model_ref}


def _print_dry_run(spec: LaunchSpec, *, argv: bool = True) -> None:
    click.echo(f"# recipe {spec.recipe}: {spec.recipe_reason}")
    if spec.model_ref is not None:
        click.echo(f"# model version {spec.model_ref.content_hash}"
                   + "".join(f" (+ adapter {a.name})" for a in spec.model_ref.adapters))
    if spec.env:
        click.echo("# environment: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env.items()))
    if spec.api_key_env:
        click.echo(f"# API key from ${spec.api_key_env}, passed as $VLLM_API_KEY")
    if argv:
        click.echo(shlex.join(spec.argv))
        click.echo(f"\n# {spec.run_dir / 'config.yaml'}")
        click.echo(spec.config_yaml.rstrip())
        click.echo("")
    _print_plan(spec.plan, spec.notes)


@click.group("recipes")
def recipes_cmd() -> None:
    """Serving recipes: vLLM settings profiled per GPU and workload.

    \b
    Examples:
      qlift recipes list
      qlift recipes list --gpu A100-80GB --json
      qlift recipes show chat-4090
    """


@recipes_cmd.command("list")
@_hardware_options
@json_option
def recipes_list_cmd(gpu: str | None, gpus: int | None) -> None:
    """List recipes; mark those that suit this machine (or the --gpu given).

    \b
    Examples:
      qlift recipes list
      qlift recipes list --gpu "RTX 4090" --json
    """
    from qlift.serve.recipes import list_recipes
    from qlift.serve.select import mismatch

    hw = _hardware(gpu, gpus)
    rows: list[dict[str, Any]] = []
    for r in list_recipes():
        why = mismatch(r, hw)
        rows.append({"name": r.name, "workload": r.workload, "description": r.description,
                     "suits_this_machine": why is None, "why_not": why, "path": str(r.path)})

    def human() -> None:
        click.echo(f"hardware: {hw.describe()}")
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            mark = "*" if r["suits_this_machine"] else " "
            click.echo(f"{mark} {str(r['name']).ljust(width)}  {str(r['workload']).ljust(12)}  {r['description']}")
        click.echo("* suits this machine")

    emit(rows, human)


@recipes_cmd.command("show")
@click.argument("name")
@json_option
def recipes_show_cmd(name: str) -> None:
    """Show recipe NAME (or a recipe YAML file) as vLLM arguments and sources.

    \b
    Examples:
      qlift recipes show cpu
      qlift recipes show ./my-recipe.yaml --json
    """
    from qlift.serve.recipes import load_recipe

    r = load_recipe(name)

    def human() -> None:
        assert r.path is not None
        click.echo(f"# {r.path}")
        click.echo(r.path.read_text(encoding="utf-8").rstrip())

    emit(r.model_dump(mode="json") | {"path": str(r.path)}, human)
