"""qlift promote: canary rollout between two served versions, judged window by window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from qlift.cli.output import emit, json_option

GROUP_EPILOG = """\b
Examples:
  export QLIFT_ROUTER_TOKEN=...        # the router's admin token
  qlift promote start --router http://127.0.0.1:8080 --stable smollm2 --canary smollm2-ft \\
      --steps 10,50,100 --interval 30s --eval-report out/eval
  qlift promote start -f examples/rollout.yaml --interval 1m
  qlift promote status --json          # state, weights, every window's evidence and decision
  qlift promote pause | resume | abort | promote
"""

journal_option = click.option(
    "--journal", type=click.Path(path_type=Path), default=None,
    help="Rollout journal (SQLite). Default: $QLIFT_HOME/rollouts/journal.sqlite.")


@click.group("promote", epilog=GROUP_EPILOG)
def promote_group() -> None:
    """Canary promotion: 10 -> 50 -> 100 with LLM-aware analysis and automatic rollback.

    `start` runs in the foreground until the canary is promoted (exit 0) or rolled back
    (exit 10); run it again (or `resume`) after a crash to continue at the recorded step.
    The other commands act on the journal from any shell. A bad spec exits 2.
    """


def _parse_backends(values: tuple[str, ...]) -> dict[str, str] | None:
    if not values:
        return None
    out = {}
    for v in values:
        name, sep, url = v.partition("=")
        if not sep or not name or not url:
            from qlift.errors import BadInputError

            raise BadInputError(f"--backend '{v}' is not NAME=URL", field="--backend")
        out[name] = url
    return out


def _parse_steps(value: str | None) -> list[Any] | None:
    if value is None:
        return None
    return [int(s) if s.strip().isdigit() else s.strip() for s in value.split(",")]


@promote_group.command("start", epilog="""\b
Examples:
  qlift promote start --router http://127.0.0.1:8080 --stable smollm2 --canary smollm2-ft
  qlift promote start -f rollout.yaml --min-requests 50 --webhook http://127.0.0.1:9000/hook
  qlift promote start -f rollout.yaml --data-plane nginx --json
""")
@click.option("-f", "--file", "spec_file", type=click.Path(path_type=Path), help="Rollout spec YAML (flags override).")
@click.option("--router", help="URL of the qlift router (builtin data plane and evidence).")
@click.option("--stable", help="Name of the stable version (a router backend name).")
@click.option("--canary", help="Name of the canary version.")
@click.option("--steps", help="Canary weights, e.g. 10,50,100 (must end at 100).")
@click.option("--interval", help="Analysis window, e.g. 30s, 2m.")
@click.option("--min-requests", type=int, help="Canary requests a window needs before it can pass.")
@click.option("--max-error-rate", type=float, help="Highest canary error rate that passes.")
@click.option("--max-latency-ratio", type=float, help="Highest canary/stable latency ratio.")
@click.option("--max-ttft-ratio", type=float, help="Highest canary/stable time-to-first-token ratio.")
@click.option("--max-inconclusive", type=int, help="Inconclusive windows per step before a rollback.")
@click.option("--eval-report", type=click.Path(path_type=Path), help="Refuse to start unless this `qlift eval "
              "--report` dir passed for the model the canary serves.")
@click.option("--canary-model", type=click.Path(path_type=Path),
              help="The canary's model dir for --eval-report (default: the root its vLLM server reports).")
@click.option("--data-plane", type=click.Choice(["builtin", "nginx", "gateway-api"]), help="Where weights live.")
@click.option("--prometheus", "prometheus_url", help="Judge on Prometheus queries from this server instead.")
@click.option("--backend", "backends", multiple=True, metavar="NAME=URL",
              help="A version's server URL (nginx upstreams, vLLM /metrics); repeatable.")
@click.option("--webhook", help="POST a JSON event here on every decision.")
@journal_option
@json_option
def start_cmd(spec_file: Path | None, journal: Path | None, prometheus_url: str | None,
              backends: tuple[str, ...], **flags: Any) -> None:
    """Start a rollout of --canary over --stable, or resume the journal's unfinished one.

    Each step sets the weights, waits one --interval, compares the versions over that
    window and advances, holds (too little data) or rolls back (a failing check).
    Exit codes: 0 promoted, 10 rolled back, 1 aborted, 2 bad spec.
    """
    from qlift.rollout import build_spec, read_spec_file, start
    from qlift.rollout.api import raise_for_outcome, status

    overrides: dict[str, Any] = {
        "router": flags["router"], "stable": flags["stable"], "canary": flags["canary"],
        "steps": _parse_steps(flags["steps"]), "interval": flags["interval"],
        "analysis.min_requests": flags["min_requests"], "analysis.max_error_rate": flags["max_error_rate"],
        "analysis.max_latency_ratio": flags["max_latency_ratio"],
        "analysis.max_ttft_ratio": flags["max_ttft_ratio"], "analysis.max_inconclusive": flags["max_inconclusive"],
        "eval_report": flags["eval_report"], "canary_model": flags["canary_model"],
        "data_plane": flags["data_plane"], "webhook": flags["webhook"], "backends": _parse_backends(backends),
    }
    if prometheus_url:
        overrides.update({"provider": "prometheus", "prometheus.url": prometheus_url})
    file_data = read_spec_file(spec_file) if spec_file else {}
    if overrides["backends"] and isinstance(file_data.get("backends"), dict):
        overrides["backends"] = {**file_data["backends"], **overrides["backends"]}
    spec = build_spec(file_data, overrides, path=spec_file)
    final = start(spec, journal)
    emit(status(journal), lambda: _show(status(journal)))
    raise_for_outcome(final)


@promote_group.command("status", epilog="""\b
Examples:
  qlift promote status
  qlift promote status --json | jq '.state, .weights'
""")
@journal_option
@json_option
def status_cmd(journal: Path | None) -> None:
    """Show the latest rollout: state, weights, steps, every window's evidence and decision."""
    from qlift.rollout import status

    st = status(journal)
    emit(st, lambda: _show(st))


def _control(name: str, doc: str, example: str) -> None:
    @promote_group.command(name, help=doc, epilog=f"\b\nExamples:\n  {example}\n  {example} --json\n")
    @journal_option
    @json_option
    def cmd(journal: Path | None) -> None:
        import qlift.rollout as rollout
        from qlift.rollout.api import raise_for_outcome

        fn = {"pause": rollout.pause, "resume": rollout.resume, "abort": rollout.abort,
              "promote": rollout.promote_now}[name]
        final = fn(journal)
        st = rollout.status(journal)
        emit(st, lambda: _show(st))
        if name == "resume":
            raise_for_outcome(final)


_control("pause", "Pause the rollout: weights stay; no window is judged until `resume`.", "qlift promote pause")
_control("resume", "Resume a paused (or crashed) rollout; runs the controller here if none is running.",
         "qlift promote resume")
_control("abort", "Abort: weights back to 100% stable (journaled first), state aborted.", "qlift promote abort")
_control("promote", "Promote now: 100% canary, skipping the remaining analysis (recorded as manual).",
         "qlift promote promote")


def _fmt(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _version_cell(ev: dict[str, Any]) -> str:
    return f"{ev['requests']}/{_fmt(ev['errors'], 'd')}/{_fmt(ev['latency_p50'])}s"


def _show(st: dict[str, Any]) -> None:
    weights = " / ".join(f"{k} {v}%" for k, v in (st["weights"] or {}).items()) or "-"
    pending = "" if st["weights_applied"] else " (journaled, not yet applied)"
    click.echo(f"rollout {st['id']}: {st['canary']} over {st['stable']} -- {st['state']}, weights {weights}{pending}")
    if st["controller_pid"]:
        click.echo(f"controller pid {st['controller_pid']}")
    row = "{:>4}  {:>6}  {:<12} {:<17} {:<22} {:<22} {}"
    click.echo(row.format("step", "weight", "outcome", "window", "canary req/err/p50", "stable req/err/p50",
                          "decision"))
    for s in st["steps"]:
        outcome = s["outcome"] or ("running" if s["started_at"] else "-")
        if not s["windows"]:
            click.echo(row.format(s["index"] + 1, f"{s['weight']}%", outcome, "-", "", "", ""))
        for w in s["windows"]:
            span = f"{w['started_at'][11:19]}-{w['ended_at'][11:19]}"
            click.echo(row.format(s["index"] + 1, f"{s['weight']}%", outcome, span, _version_cell(w["canary"]),
                                  _version_cell(w["stable"]), w["action"]))
    if st["reason"]:
        click.echo(f"reason: {st['reason']}")
