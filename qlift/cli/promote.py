"""qlift promote: canary rollout between two served versions, judged window by window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from qlift.cli.output import emit, json_option
from qlift.rollout.spec import spec_options, spec_overrides

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
    States: shadowing, progressing, paused, abort_requested, and the final promoted,
    rolled_back, aborted (docs/promote.md).
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


@promote_group.command("start", epilog="""\b
Examples:
  qlift promote start --router http://127.0.0.1:8080 --stable smollm2 --canary smollm2-ft
  qlift promote start --router http://127.0.0.1:8080 --stable smollm2 --canary smollm2-ft \\
      --shadow 20% --shadow-windows 2         # mirrored traffic first: no user sees the canary yet
  qlift promote start -f rollout.yaml --min-requests 50 --webhook http://127.0.0.1:9000/hook
  qlift promote start -f rollout.yaml --data-plane nginx --json
  qlift promote start -f rollout.yaml --new   # after a promotion: start the next rollout

\b
Window sizing: a window must see min_requests canary requests, i.e.
weight x requests/s x interval >= --min-requests (10% of 2 req/s over 30s = 6).
Too little traffic pauses the rollout (--on-insufficient rollback to roll back instead).
""")
@click.option("-f", "--file", "spec_file", type=click.Path(path_type=Path), help="Rollout spec YAML (flags override).")
@spec_options("spec", "analysis")
@click.option("--shadow", "shadow_percent", metavar="PERCENT",
              help="Shadow phase first: mirror this share of live requests (e.g. 20%) to the canary and judge its "
              "answers against the stable's; users see none of them (qlift router only). (spec: shadow.percent)")
@spec_options("shadow")
@click.option("--canary-adapter", metavar="NAME=DIR",
              help="Load LoRA adapter DIR as model NAME into the stable's vLLM server first (runtime loading; the "
              "router's canary backend is STABLE_URL#NAME); unloaded after a rollback or abort (docs/lora.md).")
@click.option("--prometheus", "prometheus_url", help="Judge on Prometheus queries from this server instead.")
@click.option("--backend", "backends", multiple=True, metavar="NAME=URL",
              help="A version's server URL (nginx upstreams, vLLM /metrics); repeatable.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
              help="Serve the rollout's state, weights and window decisions (and on nginx, nginx's answers by "
              "status class) at http://127.0.0.1:PORT/metrics while it runs, for Prometheus and the dashboards.")
@click.option("--new", "new", is_flag=True, help="Start a new rollout even though the journal's last one was "
              "promoted (without it, `start` after a promotion starts nothing).")
@journal_option
@json_option
def start_cmd(spec_file: Path | None, journal: Path | None, prometheus_url: str | None,
              backends: tuple[str, ...], metrics_port: int | None, new: bool, **flags: Any) -> None:
    """Start a rollout of --canary over --stable, or resume the journal's unfinished one.

    With --shadow, a shadow phase comes first. Then each step sets the weights, waits one
    --interval, compares the versions over that window and advances, holds (too little
    data) or rolls back (a failing check); too little canary traffic for --max-inconclusive
    windows pauses it. Every window the data plane's weights are re-read and re-applied if
    they drifted. Exit codes: 0 promoted, 10 rolled back, 1 aborted, 2 bad input.
    """
    from qlift.rollout import build_spec, read_spec_file, start
    from qlift.rollout.api import raise_for_outcome, status

    canary_adapter = flags.pop("canary_adapter")
    overrides: dict[str, Any] = {"backends": _parse_backends(backends), "shadow.percent": flags.pop("shadow_percent"),
                                 **spec_overrides(flags)}
    if prometheus_url:
        overrides.update({"provider": "prometheus", "prometheus.url": prometheus_url})
    file_data = read_spec_file(spec_file) if spec_file else {}
    if overrides["backends"] and isinstance(file_data.get("backends"), dict):
        overrides["backends"] = {**file_data["backends"], **overrides["backends"]}
    spec = build_spec(file_data, overrides, path=spec_file)
    if metrics_port is not None:
        from qlift.rollout.api import default_journal
        from qlift.rollout.exporter import serve_metrics

        serve_metrics(journal or default_journal(), metrics_port)
    if canary_adapter:
        from qlift.rollout.adapter import start_with_adapter
        from qlift.serve.lora import parse_lora_flag

        name, adapter_dir = parse_lora_flag(canary_adapter, flag="--canary-adapter")
        final = start_with_adapter(spec, journal, name, adapter_dir, new=new)[0]
    else:
        final = start(spec, journal, new=new)
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
_control("resume", "Resume a paused (or crashed) rollout, or retry an abort the data plane did not confirm; runs "
         "the controller here if none is running.", "qlift promote resume")
_control("abort", "Abort: 100% stable journaled (abort_requested), applied, then aborted once the data plane "
         "confirms; run it again if the data plane was unreachable. On a full disk the weights are restored first "
         "and the abort journaled by the next `abort`.", "qlift promote abort")
_control("promote", "Promote now: 100% canary, skipping the remaining analysis (recorded as manual).",
         "qlift promote promote")


def _fmt(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _version_cell(ev: dict[str, Any]) -> str:
    return f"{ev.get('requests', '-')}/{_fmt(ev.get('errors'), 'd')}/{_fmt(ev.get('latency_p50'))}s"


def _limits(c: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in c.get("limits", {}).items())


def _show(st: dict[str, Any]) -> None:
    weights = " / ".join(f"{k} {v}%" for k, v in (st["weights"] or {}).items()) or "-"
    pending = "" if st["weights_applied"] else " (journaled, not yet applied)"
    click.echo(f"rollout {st['id']}: {st['canary']} over {st['stable']} -- {st['state']}, weights {weights}{pending}")
    click.echo(f"  {st['state_doc']}")
    ctl = st["controller"]
    if ctl["alive"]:
        beat = "" if ctl["heartbeat_age_s"] is None else f", last heartbeat {ctl['heartbeat_age_s']:.0f}s ago"
        click.echo(f"controller: pid {ctl['pid']} running{beat}" + (" (stalled?)" if ctl["stalled"] else ""))
    elif st["state"] not in ("promoted", "rolled_back", "aborted"):
        click.echo("controller: none running -- nothing advances or watches this rollout; "
                   "`qlift promote resume` runs one")
    if st.get("abort_not_journaled"):
        click.echo("abort: applied to the data plane while the journal was full, not journaled yet -- free disk "
                   "space and run `qlift promote abort` again")
    if st["drifts"] or st["webhook_failures"]:
        click.echo(f"events: {st['drifts']} weight drift(s) re-applied, {st['webhook_failures']} webhook failure(s)")
    click.echo("judge compares, canary vs stable: " + "; ".join(
        f"{c['name']} ({_limits(c)})" for c in st["compares"]))
    click.echo(f"answer checks (loops, off_language, refusal, schema_broken) run in: {st['answer_checks']['note']}")
    row = "{:>6}  {:>6}  {:<12} {:<17} {:<22} {:<22} {}"
    click.echo(row.format("step", "weight", "outcome", "window", "canary req/err/p50", "stable req/err/p50",
                          "decision"))
    if st.get("shadow"):
        for w in st["shadow"]["windows"]:
            span = f"{w['started_at'][11:19]}-{w['ended_at'][11:19]}"
            click.echo(row.format("shadow", f"{st['shadow']['spec']['percent']}%", "mirrored", span,
                                  _version_cell(w["canary"]), _version_cell(w["stable"]), w["action"]))
    for s in st["steps"]:
        outcome = s["outcome"] or ("running" if s["started_at"] else "-")
        if not s["windows"]:
            click.echo(row.format(s["index"] + 1, f"{s['weight']}%", outcome, "-", "", "", s["judged"]
                                  if s["weight"] == 100 else ""))
        for w in s["windows"]:
            span = f"{w['started_at'][11:19]}-{w['ended_at'][11:19]}"
            click.echo(row.format(s["index"] + 1, f"{s['weight']}%", outcome, span, _version_cell(w["canary"]),
                                  _version_cell(w["stable"]), w["action"]))
    if st["reason"]:
        click.echo(f"reason: {st['reason']}")
    _show_examples(st)


def _show_examples(st: dict[str, Any]) -> None:
    """The answers behind a failed answer check: what a person reads before trusting the rollback."""
    windows = [w for s in st["steps"] for w in s["windows"]] + (st["shadow"]["windows"] if st.get("shadow") else [])
    for w in windows:
        for c in w.get("checks") or []:
            if c.get("status") != "fail" or not c.get("examples"):
                continue
            click.echo(f"{c['name']} examples ({w['started_at'][11:19]} window):")
            for e in c["examples"]:
                click.echo(f"  prompt: {e['prompt']}")
                click.echo(f"    canary: {e['answer']}")
                if e.get("other") is not None:
                    click.echo(f"    stable: {e['other']}")
