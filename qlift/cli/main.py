"""Entry point: global options, lazy command registry, and the one error handler."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import platform
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click
from click.utils import PacifyFlushWrapper

from qlift import __version__
from qlift.cli.output import STATE, configure_logging
from qlift.errors import INTERNAL_ERROR_EXIT, QliftError, Terminated, exit_code_for
from qlift.settings import debug_enabled

# name -> (module, attribute, one-line summary). Summaries live here so that
# `qlift --help` imports no command module, and so no torch or vLLM.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "inspect": ("qlift.cli.inspect", "inspect_cmd", "Describe a model directory: shape, size, dtype, lineage."),
    "download": ("qlift.cli.download", "download_cmd", "Download a Hub/ModelScope repo pinned to a commit, hashed."),
    "verify": ("qlift.cli.download", "verify_cmd", "Re-hash a downloaded directory against its qlift.lock.json."),
    "import-gguf": ("qlift.cli.import_gguf", "import_gguf_cmd", "GGUF (or the built-in SmolLM2) to safetensors."),
    "merge": ("qlift.cli.merge", "merge_cmd", "Merge LoRA adapters into a base model, shard by shard, exact to peft."),
    "serve": ("qlift.cli.serve", "serve_cmd", "Serve a model with vLLM using a hardware-profiled recipe."),
    "plan": ("qlift.cli.serve", "plan_cmd", "Memory plan: will a model fit a recipe on this (or a named) GPU?"),
    "recipes": ("qlift.cli.serve", "recipes_cmd", "List and show serving recipes (vLLM settings per GPU/workload)."),
    "eval": ("qlift.cli.eval", "eval_cmd", "Candidate vs baseline on held-out prompts: metrics, bootstrap CIs, gates."),
    "quantize": ("qlift.cli.quantize", "quantize_cmd", "AWQ (int4) or FP8 quantization with llm-compressor (own env)."),
    "env": ("qlift.cli.quantize", "env_group", "Manage qlift's tool environments (llm-compressor for quantize)."),
    "promote": ("qlift.cli.promote", "promote_group",
                "Canary rollout 10->50->100 with LLM-aware analysis and rollback."),
    "router": ("qlift.cli.router", "router_cmd", "OpenAI gateway splitting traffic between model versions."),
    "batch": ("qlift.cli.batch", "batch_cmd", "Offline inference over a JSONL file: one vLLM engine, resumable."),
    "bench": ("qlift.cli.bench", "bench_cmd", "Benchmark a vLLM server per concurrency: latencies, tok/s, goodput."),
    "tune": ("qlift.cli.tune", "tune_cmd", "Measure a grid of vLLM settings and write the best as a recipe."),
    "lora": ("qlift.cli.lora", "lora_group", "LoRA adapters on a running vLLM server: list, load, unload (checked)."),
    "release": ("qlift.cli.release", "release_group",
                "A whole release from one file: cached by content, resumable, ends in a judged canary."),
    "deploy": ("qlift.cli.deploy", "deploy_group", "Kubernetes manifests: vLLM, queue-depth HPA, HTTPRoute or Argo."),
}

EPILOG = """\b
Examples:
  qlift import-gguf --builtin smollm2 -o smollm2     # the embedded default model
  qlift download Qwen/Qwen2.5-7B-Instruct -o base    # pinned commit, sha256 lockfile
  qlift merge base ./my-lora -o merged               # streamed LoRA merge, checked against peft
  qlift quantize merged --awq -o merged-awq          # llm-compressor in its own environment
  qlift eval merged-awq --baseline merged --prompts held-out.jsonl --gate "ppl <= baseline * 1.05"
  qlift serve merged-awq --recipe auto               # vLLM from a hardware-profiled recipe
  qlift inspect merged-awq --json                    # shape, size, quantization, lineage
"""


class QliftGroup(click.Group):
    """Loads command modules on first use and maps every error to one line + exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return super().get_command(ctx, cmd_name)
        module, attr, _ = entry
        cmd: click.Command = getattr(importlib.import_module(module), attr)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (name, COMMANDS[name][2] if name in COMMANDS else self.commands[name].get_short_help_str())
            for name in self.list_commands(ctx)
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,  # type: ignore[override]
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        """Click's own handling, except that its errors are one line too (Click prints three for
        a usage error: usage, "Try --help", the error)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except BrokenPipeError:  # a usage line into a closed pipe
            _stdout_gone()
        except SystemExit as exc:  # Click's own quiet exit 1 for --help into a closed pipe: the same 141
            if exc.code == 1 and type(sys.stdout) is PacifyFlushWrapper:
                _stdout_gone()
            raise
        except click.UsageError as exc:
            click.echo(usage_error_line(exc), err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort as exc:  # Ctrl-C while Click parses, or a declined prompt
            interrupt = exc.__cause__ if isinstance(exc.__cause__, KeyboardInterrupt) else None
            click.echo("aborted" if interrupt is None else "interrupted", err=True)
            sys.exit(1 if interrupt is None else exit_code_for(interrupt))
        # Not standalone, Click returns what the command returned, or the code it exited with;
        # invoke() below returns nothing, so an int here is always an exit code.
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> None:
        try:
            super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except BrokenPipeError:  # `qlift recipes list | head`: the reader has all it wanted
            _stdout_gone()
        except QliftError as exc:
            _report(exc, f"error: {exc.one_line()}")
            ctx.exit(exit_code_for(exc))
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as Terminated
            click.echo("terminated" if isinstance(exc, Terminated) else "interrupted", err=True)
            ctx.exit(exit_code_for(exc))
        except Exception as exc:  # a bug in qlift or a library: say so, keep it short
            _report(
                exc,
                f"internal error: {type(exc).__name__}: {exc} "
                "(rerun with --debug for the traceback and report it)",
            )
            ctx.exit(INTERNAL_ERROR_EXIT)


def usage_error_line(exc: click.UsageError) -> str:
    """'error: missing argument 'BASE'. See `qlift merge --help`.': the problem and where the fix is."""
    message = " ".join(exc.format_message().split())
    if message[1:2].islower():  # "Missing argument" -> "missing argument"; leave "URL ..." alone
        message = message[0].lower() + message[1:]
    if not message.endswith((".", "?")):
        message += "."
    words = exc.ctx.command_path.split() if exc.ctx is not None else []
    command = " ".join(["qlift", *words[1:]])  # the root's own name differs under CliRunner
    return f"error: {message} See `{command} --help`."


EXIT_PIPE_CLOSED = 128 + signal.SIGPIPE  # 141: what a shell reports for coreutils killed by SIGPIPE


def _stdout_gone() -> None:
    """stdout's reader went away (a pipe into `head`): exit quietly, as other CLIs do. stdout
    is pointed at /dev/null first, so that Python's flush at exit has nothing to fail on."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(EXIT_PIPE_CLOSED)


def _report(exc: BaseException, line: str) -> None:
    if STATE.debug:
        traceback.print_exception(exc, file=sys.stderr)
        click.echo(f"qlift {__version__}, Python {platform.python_version()}", err=True)
    click.echo(line, err=True)


@click.group(cls=QliftGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="qlift")
@click.option("--json", "json_", is_flag=True, help="Machine-readable result on stdout; logs on stderr.")
@click.option("-v", "--verbose", count=True, help="More log output (repeatable).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors; no progress bars.")
@click.option("--debug", is_flag=True, envvar="QLIFT_DEBUG", help="Show tracebacks (also QLIFT_DEBUG=1).")
def cli(json_: bool, verbose: int, quiet: bool, debug: bool) -> None:
    """qlift: take a fine-tuned LLM checkpoint from the hub to production traffic.

    Download, merge, quantize, evaluate, serve and promote Qwen2.5-class models on vLLM.
    """
    from qlift import progress

    STATE.json = json_
    STATE.verbose = verbose
    STATE.quiet = quiet
    STATE.debug = debug or debug_enabled()
    progress.set_enabled(not quiet)
    configure_logging()


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def main() -> None:
    logging.captureWarnings(True)
    signal.signal(signal.SIGTERM, _terminate)
    cli(prog_name="qlift")
