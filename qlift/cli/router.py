"""qlift router: the OpenAI-compatible gateway in front of model versions."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from qlift.cli.options import click_options
from qlift.cli.output import STATE, json_option

if TYPE_CHECKING:
    from qlift.router.app import Router

EPILOG = """\b
Examples:
  qlift router --backend stable=http://127.0.0.1:8001 --backend canary=http://127.0.0.1:8002 \\
      --weight stable=90 --weight canary=10 --public-model chat --port 8000
  qlift router --backend stable=http://127.0.0.1:8001#smollm2 --port 0 --json   # ready line as JSON
  qlift router --config router.yaml                                             # keys, limits, filter
  QLIFT_ROUTER_TOKEN=secret qlift router --config router.yaml                   # with the admin API
  QLIFT_ROUTER_TOKEN=secret qlift router --config router.yaml --take-over       # restart, no outage

\b
Restarting without an outage (an upgrade, a changed setting): start the new router with the same
--host/--port/--config plus --take-over. It receives the running router's listening socket and its
weights, shadow settings and backends, prints its ready line once serving, and the old router then
drains and exits by itself (no SIGTERM needed). Without a router running there, it simply starts.
"""


def config_flags(fn: Any) -> Any:
    """One option per RouterConfig field in FLAG_FIELDS, its help the field's description."""
    from qlift.options import option_fields
    from qlift.router.config import FLAG_FIELDS, RouterConfig

    fields = {f.name: f for f in option_fields(RouterConfig)}
    return click_options([fields[name] for name in FLAG_FIELDS])(fn)


@click.command("router", epilog=EPILOG)
@click.option("--backend", "backends", multiple=True, metavar="NAME=URL[#MODEL]",
              help="A backend (an OpenAI-compatible server such as vLLM) and the model it serves there, checked "
                   "against its /v1/models. Repeatable. Without #MODEL the router takes the first model listed. "
                   "Credentials in the URL (http://user:pw@host:port) go to the backend as basic auth and are "
                   "never printed.")
@click.option("--weight", "weights", multiple=True, metavar="NAME=PCT",
              help="Percent of traffic for a backend; all weights sum to 100. Repeatable.")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="router.yaml with the same settings and more (keys, limits, filter, timeouts); flags win.")
@config_flags
@click.option("--take-over", is_flag=True,
              help="Take over the router running on this --host/--port without refusing a connection: its "
                   "listening socket, weights, shadow settings and backends pass to this process; it then drains "
                   "and exits (and stays up if this one fails to start). Run as its user, with its QLIFT_HOME.")
@json_option
def router_cmd(backends: tuple[str, ...], weights: tuple[str, ...], config_path: Path | None, take_over: bool,
               **flags: Any) -> None:
    """Route OpenAI chat/completions traffic between model versions by weight or session.

    Splits requests between backends by weight (sticky per X-Session-Id or `user`), streams
    answers through, replays a request that failed before its first byte on another backend,
    and adds API keys, rate limits, a content filter, JSON access logs and Prometheus /metrics.
    Runs until Ctrl-C or SIGTERM, then lets in-flight requests finish. With QLIFT_ROUTER_TOKEN
    set, /admin/state, PUT /admin/weights and /admin/shadow drive it (what `qlift promote` uses).
    """
    from qlift import router
    from qlift.router.config import build_config
    from qlift.settings import router_token

    config = build_config(config_path=config_path, backends=list(backends), weights=list(weights), flags=flags)
    router.run(router.RouterInputs(router_token(), take_over=take_over), config, on_ready=_print_ready,
               restore_signals=False)


def _print_ready(router: Router) -> None:
    if STATE.json:
        click.echo(json.dumps({"url": router.url, "pid": os.getpid(), "public_model": router.public_model,
                               "weights": router.balancer.weights,
                               "backends": [b.state() for b in router.balancer.backends],
                               "admin": router.admin_token is not None, "took_over_from": router.took_over_from}))
    else:
        parts = ", ".join(f"{b.name} {b.weight}% ({'up' if b.healthy else 'DOWN'})" for b in router.balancer.backends)
        model = repr(router.public_model) if router.public_model else "(pending: first backend not answering)"
        took = f" (took over from pid {router.took_over_from})" if router.took_over_from else ""
        click.echo(f"router ready at {router.url} (pid {os.getpid()}): model {model} -> {parts}{took}")
