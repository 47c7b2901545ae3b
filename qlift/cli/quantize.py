"""qlift quantize, and qlift env quantize (its managed llm-compressor environment)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from qlift.cli.options import click_options
from qlift.cli.output import STATE, emit, human_bytes, json_option
from qlift.quantize.options import QuantizeOptions


@click.command("quantize")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--awq", is_flag=True, help="AWQ W4A16: int4 asymmetric, group-wise (calibrated).")
@click.option("--fp8", is_flag=True, help="FP8 dynamic: per-channel weights, per-token activations.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Output model directory.")
@click_options(QuantizeOptions, exclude=("method",), spelled={"method=awq": "--awq", "method=fp8": "--fp8"})
@json_option
def quantize_cmd(model: Path, awq: bool, fp8: bool, output: Path, **options: Any) -> None:
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
    from qlift import quantize
    from qlift.models.ref import ModelRef
    from qlift.progress import StepBar

    opts = QuantizeOptions.from_switches(awq=awq, fp8=fp8, **options)
    bar = StepBar("calibrating layers", unit="layer")
    try:
        result = quantize.run(
            quantize.QuantizeInputs(ModelRef.at(model), output), opts,
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
@click.option("--wheelhouse", type=click.Path(path_type=Path), metavar="DIR",
              help="With --setup: install offline from the wheels in DIR (pip --no-index).")
@click.option("--download-wheelhouse", type=click.Path(path_type=Path), metavar="DIR",
              help="Download the wheels it needs into DIR, for --setup --wheelhouse on a machine with no "
              "package index.")
@click.option("--python-version", metavar="X.Y",
              help="With --download-wheelhouse: the target's Python (default: this one).")
@click.option("--platform", "platforms", multiple=True, metavar="TAG",
              help="With --download-wheelhouse: the target's platform tag, e.g. manylinux_2_28_x86_64 (repeatable; "
              "default: this machine's).")
@click.option("--have", type=click.Path(path_type=Path), metavar="FILE",
              help="With --download-wheelhouse: the target's `pip freeze` (or package names), left out of DIR.")
@json_option
def env_quantize_cmd(action: str, wheelhouse: Path | None, download_wheelhouse: Path | None,
                     python_version: str | None, platforms: tuple[str, ...], have: Path | None) -> None:
    """The llm-compressor environment used by `qlift quantize`.

    It lives in qlift's cache dir (QLIFT_CACHE_DIR), keyed by a hash of its pinned spec,
    and reuses this environment's torch through a .pth file; its own pins come first.

    For a machine with no package index, download a wheelhouse on a connected one, for the
    target's Python and platform and without what it already has, copy it over, and build
    there with --setup --wheelhouse. torch is never downloaded: the target brings its own.

    \b
    Examples:
      qlift env quantize --setup --json
      qlift env quantize --download-wheelhouse wh --python-version 3.12 \\
          --platform manylinux_2_28_x86_64 --have target-freeze.txt
      qlift env quantize --setup --wheelhouse wh     # on the target, offline
    """
    from qlift.errors import BadInputError
    from qlift.quantize.env import quantize_env

    if wheelhouse and action != "setup":
        raise BadInputError("--wheelhouse goes with --setup", hint="Run `qlift env quantize --setup --wheelhouse DIR`.")
    if (python_version or platforms or have) and not download_wheelhouse:
        raise BadInputError("--python-version, --platform and --have go with --download-wheelhouse",
                            hint="Add --download-wheelhouse DIR.")
    env = quantize_env()
    if download_wheelhouse:
        _download_wheelhouse(env.spec.requirements, download_wheelhouse, python_version, platforms, have)
        return
    if action == "remove":
        removed = env.remove()
        emit({"removed": removed}, lambda: click.echo(
            "\n".join(f"removed {p}" for p in removed) or "no quantize environment to remove"))
        return
    if action == "setup":
        ensured = env.ensure(lambda msg: click.echo(f"env: {msg}", err=True), verify=True, wheelhouse=wheelhouse)
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


def _download_wheelhouse(requirements: tuple[str, ...], dest: Path, python_version: str | None,
                         platforms: tuple[str, ...], have: Path | None) -> None:
    import sys

    from qlift.wheelhouse import download_wheelhouse, read_have

    result = download_wheelhouse(
        list(requirements), dest, python_version=python_version or f"{sys.version_info[0]}.{sys.version_info[1]}",
        platforms=list(platforms), have=read_have(have) if have else None,
        say=None if STATE.quiet else lambda msg: click.echo(f"env: {msg}", err=True),
    )

    def human() -> None:
        kept = ", ".join(f"{n} {v}" for n, v in sorted(result.kept_from_target.items()))
        click.echo(f"wrote {len(result.wheels)} wheels ({human_bytes(result.size_bytes)}) to {result.path} "
                   f"in {result.seconds:.1f} s")
        if kept:
            click.echo(f"left out (the target has them): {kept}")
        click.echo(f"on the target: qlift env quantize --setup --wheelhouse {result.path}")

    emit(result, human)
