"""qlift quantize, and qlift env quantize (its managed llm-compressor environment)."""

from __future__ import annotations

from pathlib import Path

import click

from qlift.cli.output import STATE, emit, human_bytes, json_option
from qlift.cli.params import count


@click.command("quantize")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--awq", is_flag=True, help="AWQ W4A16: int4 asymmetric, group-wise (calibrated).")
@click.option("--fp8", is_flag=True, help="FP8 dynamic: per-channel weights, per-token activations.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Output model directory.")
@click.option("--calib", type=click.Path(path_type=Path),
              help="Calibration JSONL, one {'messages': [...]} or {'text': ...} per line (default: built-in set).")
@click.option("--num-samples", type=count(1, 1_000_000),
              help="Calibration samples (default: 32 on CPU, the whole set on CUDA).")
@click.option("--seq-len", type=count(1, 1 << 20),
              help="Tokens per calibration sample (default: 256 on CPU, 512 on CUDA).")
@click.option("--group-size", type=click.Choice(["auto", "32", "64", "128"]), default="auto", show_default=True,
              help="AWQ group size; auto picks the largest that divides every quantized layer's input dim.")
@click.option("--ignore", "ignore", multiple=True, metavar="PATTERN", callback=lambda c, p, v: _regexes(v),
              help="Keep a layer unquantized: module name or re:REGEX (repeatable). lm_head and embeddings always are.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where llm-compressor runs.")
@click.option("--threads", type=count(1, 4096),
              help="CPU threads for calibration (default: the CPUs this process may use, by affinity and cgroup "
                   "quota).")
@click.option("--compute-dtype", type=click.Choice(["auto", "bfloat16", "float32"]), default="auto",
              show_default=True,
              help="Calibration dtype on CPU; auto: float32 where the CPU has no bf16 units (AVX512-BF16 or AMX), "
                   "else the model's own. The checkpoint is written in the model's dtype either way.")
@click.option("--target-recipe", metavar="NAME",
              help="Warn about the hardware the model will be served on: a serving recipe, a GPU name, or cpu.")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@json_option
def quantize_cmd(
    model: Path, awq: bool, fp8: bool, output: Path, calib: Path | None, num_samples: int | None,
    seq_len: int | None, group_size: str, ignore: tuple[str, ...], device: str, threads: int | None,
    compute_dtype: str, target_recipe: str | None, force: bool,
) -> None:
    """Quantize MODEL with llm-compressor into a compressed-tensors checkpoint vLLM loads.

    llm-compressor runs in its own environment, which qlift builds on first use (about a
    minute; `qlift env quantize --info` shows it). The output carries the tokenizer, chat
    template, generation config and a qlift.json lineage manifest.

    \b
    Examples:
      qlift quantize smollm2 --awq -o smollm2-awq                # built-in calibration set
      qlift quantize model --awq --calib chats.jsonl --num-samples 128 --seq-len 512 -o model-awq
      qlift quantize model --fp8 -o model-fp8 --target-recipe chat-h100
      qlift quantize smollm2 --awq -o smollm2-awq --threads 1   # beside a server pinned to the other core
    """
    from qlift.errors import BadInputError
    from qlift.quantize.api import quantize
    from qlift.quantize.options import Method, QuantizeOptions

    if awq == fp8:
        if awq:
            raise BadInputError("--awq and --fp8 together", hint="Pass only one of them.")
        raise BadInputError("choose a method", hint="Pass --awq or --fp8.")
    method: Method = "awq" if awq else "fp8"
    explicit_group = method == "awq" and group_size != "auto"
    from qlift.progress import StepBar

    bar = StepBar("calibrating layers", unit="layer")
    try:
        opts = QuantizeOptions(method=method, calib=calib, num_samples=num_samples, seq_len=seq_len,
                               group_size=int(group_size) if explicit_group else None, ignore=tuple(ignore),
                               device=device, threads=threads, compute_dtype=compute_dtype,
                               target_recipe=target_recipe, force=force)
        result = quantize(
            model, output, opts,
            on_status=None if STATE.quiet else lambda msg: click.echo(f"quantize: {msg}", err=True),
            on_step=bar.update, echo_log=STATE.verbose > 0,
        )
    finally:
        bar.close()

    def human() -> None:
        detail = f", group {result.group_size}" if result.group_size else ""
        calib_text = (f", {result.num_samples} x {result.seq_len} tokens of {result.calibration}"
                      if result.num_samples else "")
        click.echo(
            f"wrote {result.output} ({result.method.upper()} {result.format}{detail}{calib_text}; "
            f"{human_bytes(result.source_size_bytes)} -> {human_bytes(result.size_bytes)} "
            f"in {result.seconds:.1f} s on {result.device})"
        )

    emit(result, human)


def _regexes(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """--ignore values: a ``re:`` pattern must compile (checked before any work)."""
    import re

    from qlift.errors import BadInputError

    for pat in patterns:
        if pat.startswith("re:"):
            try:
                re.compile(pat[3:])
            except re.error as exc:
                raise BadInputError(f"{pat!r} is not a regular expression ({exc})", field="--ignore",
                                    hint="Write re:REGEX (Python syntax) or a plain module name.") from None
    return patterns


@click.group("env")
def env_group() -> None:
    """Manage the tool environments qlift builds for itself.

    \b
    Examples:
      qlift env quantize --info     # where llm-compressor's environment is, what it holds
      qlift env quantize --setup    # build (or repair) it now, e.g. in a Docker build step
      qlift env quantize --remove
    """


@env_group.command("quantize")
@click.option("--setup", "action", flag_value="setup", help="Build it now, or rebuild it if broken.")
@click.option("--info", "action", flag_value="info", default=True, help="Show where it is and what is in it (default).")
@click.option("--remove", "action", flag_value="remove", help="Delete it (the next quantize builds it again).")
@json_option
def env_quantize_cmd(action: str) -> None:
    """The llm-compressor environment used by `qlift quantize`.

    It lives in qlift's cache dir (QLIFT_CACHE_DIR), keyed by a hash of its pinned spec,
    and reuses this environment's torch through a .pth file; its own pins come first.

    \b
    Examples:
      qlift env quantize --setup --json
    """
    from qlift.quantize.env import quantize_env

    env = quantize_env()
    if action == "remove":
        removed = env.remove()
        emit({"removed": removed}, lambda: click.echo(
            "\n".join(f"removed {p}" for p in removed) or "no quantize environment to remove"))
        return
    if action == "setup":
        ensured = env.ensure(lambda msg: click.echo(f"env: {msg}", err=True), verify=True)
        info = env.info()
        if not STATE.json:
            verb = "created" if ensured.created else "ready (already built)"
            click.echo(f"{verb}: {ensured.path} ({ensured.seconds:.1f} s)")
    else:
        info = env.info()

    def human() -> None:
        click.echo(f"path:         {info.path}")
        click.echo(f"state:        {'ready' if info.ready else 'not built' if not info.exists else 'broken'}")
        click.echo(f"spec:         {' '.join(info.requirements)} (key {info.key})")
        click.echo(f"inherits:     {', '.join(info.parent_site_packages)}")
        if info.created_at:
            click.echo(f"created:      {info.created_at}")
        if info.size_bytes is not None:
            click.echo(f"size:         {human_bytes(info.size_bytes)}")
        for m in info.modules:
            err = f"  ({m.error})" if m.error else ""
            click.echo(f"  {m.module:<20} {m.version or '-':<14} from {m.location}{err}")
        if not info.ready:
            click.echo("build it with: qlift env quantize --setup")

    emit(info, human)
