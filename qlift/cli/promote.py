"""qlift promote: canary rollout between two served versions, judged window by window."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from qlift.cli.options import click_options
from qlift.cli.output import emit, json_option
from qlift.options import OptionField
from qlift.rollout.spec import spec_option_fields, spec_overrides

if TYPE_CHECKING:
    from qlift.rollout.status import RolloutStatus

GROUP_EPILOG = """\b
Examples:
  export QLIFT_ROUTER_TOKEN=...        # the router's admin token
  qlift promote start --router http://127.0.0.1:8080 --stable smollm2 --canary smollm2-ft \\
      --steps 10,50,100 --interval 30s --eval-report out/eval
  qlift promote start -f examples/rollout.yaml --interval 1m
  qlift promote status --json          # state, weights, every window's evidence and decision
  qlift promote report -o rollout.html # the rollout as a page to attach to a change ticket
  qlift promote pause | resume | abort | promote
"""

journal_option = click.option(
    "--journal", type=click.Path(path_type=Path), default=None,
    help="Rollout journal (SQLite). Default: $QLIFT_HOME/rollouts/journal.sqlite (QLIFT_HOME: ~/.cache/qlift).")


class _JournalHints(click.Group):
    """Every hint an error of a promote command prints names the --journal the command was given, so the
    command it suggests acts on that journal as printed."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                             list[str]]:
        ctx.meta["promote_args"] = list(args)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        from qlift.errors import QliftError

        try:
            return super().invoke(ctx)
        except QliftError as exc:
            journal = _journal_arg(ctx.meta.get("promote_args", []))
            if journal is not None and exc.hint:
                from qlift.rollout.journal import with_journal

                exc.hint = with_journal(exc.hint, journal)
            raise


def _journal_arg(args: list[str]) -> str | None:
    for i, arg in enumerate(args):
        if arg == "--journal" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--journal="):
            return arg.split("=", 1)[1]
    return None


@click.group("promote", cls=_JournalHints, epilog=GROUP_EPILOG)
def promote_group() -> None:
    """Canary promotion: 10 -> 50 -> 100 with LLM-aware analysis and automatic rollback.

    `start` runs in the foreground until the canary is promoted (exit 0) or rolled back
    (exit 10); run it again (or `resume`) after a crash to continue at the recorded step.
    The other commands act on the journal from any shell. A bad spec exits 2.
    States: shadowing, progressing, paused, abort_requested, baking and baked (--bake), and
    the final promoted, rolled_back, aborted, finished (docs/promote.md).
    """


def _router_repeats(fields: list[OptionField]) -> list[OptionField]:
    """--router as a repeatable flag: given more than once, every router of a fleet (spec: routers)."""
    return [dataclasses.replace(f, annotation=tuple[str, ...], help=f"{f.help} May be repeated: every qlift router "
                                "of a fleet, each taking every weight (spec: routers).") if f.flag == "--router" else f
            for f in fields]


def _fleet_overrides(overrides: dict[str, Any]) -> None:
    """One --router is router: as ever; several are routers:."""
    given = list(overrides.pop("router", None) or ())
    overrides["router"] = given[0] if len(given) == 1 else None
    overrides["routers"] = given if len(given) > 1 else None


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
  qlift promote start --router http://127.0.0.1:8080 --next v3=http://127.0.0.1:8003#smollm2-v3
                                              # the next release over whatever holds 100% now

\b
Window sizing: a window must see min_requests canary requests, i.e.
weight x requests/s x interval >= --min-requests (10% of 2 req/s over 30s = 6).
Too little traffic pauses the rollout (--on-insufficient rollback to roll back instead).
""")
@click.option("-f", "--file", "spec_file", type=click.Path(path_type=Path), help="Rollout spec YAML (flags override).")
@click_options(_router_repeats(spec_option_fields("spec", "analysis")))
@click.option("--shadow", "shadow_percent", metavar="PERCENT",
              help="Shadow phase first: mirror this share of live requests (e.g. 20%) to the canary and judge its "
              "answers against the stable's; users see none of them (qlift router only). (spec: shadow.percent)")
@click_options(spec_option_fields("shadow"))
@click.option("--canary-adapter", metavar="NAME=DIR",
              help="Load LoRA adapter DIR as model NAME into the stable's vLLM server first (runtime loading; the "
              "router's canary backend is STABLE_URL#NAME); unloaded after a rollback or abort (docs/lora.md).")
@click.option("--next", "next_version", metavar="NAME=URL[#MODEL]",
              help="The next release through a running qlift router: add NAME (its server at URL, serving MODEL) "
              "at weight 0, roll it out over the version that holds 100% now (no --stable/--canary), then retire "
              "the version left unserved: the old stable once promoted or finished, NAME once rolled back or "
              "aborted. The router never restarts (docs/promote.md, the next release).")
@click.option("--prometheus", "prometheus_url", help="Judge on Prometheus queries from this server instead.")
@click.option("--backend", "backends", multiple=True, metavar="NAME=URL",
              help="A version's server URL (nginx upstreams, vLLM /metrics); repeatable.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
              help="Serve the rollout's state, weights and window decisions (and on nginx, nginx's answers by "
              "status class) at http://127.0.0.1:PORT/metrics while it runs, for Prometheus and the dashboards.")
@click.option("--new", "new", is_flag=True, help="Start a new rollout even though the journal's last one was "
              "promoted (without it, `start` after a promotion starts nothing).")
@click.option("--allow-stable-down", is_flag=True, help="Start even though the router reports the stable DOWN "
              "(without it such a start is refused, exit 8: the stable's users already go to the other backends).")
@click.option("--force", "force", is_flag=True, help="Start even though the router's live weights are not 100% "
              "stable or a shadow runs (a new rollout), or are none its journal set (a resumed one); without it "
              "such a start is refused, exit 2, and no weight moves.")
@click.option("--allow-small-windows", is_flag=True, help="Start even though, at the router's traffic of the last "
              "5 minutes, the first step's (the shadow's, the bake's) windows cannot reach --min-requests "
              "(--shadow-min-pairs) within --max-inconclusive held windows; without it such a start is refused, "
              "exit 2, naming the --interval that would.")
@journal_option
@json_option
def start_cmd(spec_file: Path | None, journal: Path | None, prometheus_url: str | None,
              backends: tuple[str, ...], metrics_port: int | None, **flags: Any) -> None:
    """Start a rollout of --canary over --stable, or resume the journal's unfinished one.

    With --shadow, a shadow phase comes first. Then each step sets the weights, waits one
    --interval, compares the versions over that window and advances, holds (too little
    data) or rolls back (a failing check); too little canary traffic for --max-inconclusive
    windows pauses it. Every window the data plane's weights are re-read and re-applied if
    they drifted; each judged window prints its decision and checks on stderr. Exit codes:
    0 promoted, 10 rolled back, 1 aborted, 2 bad input (or the router's live weights not
    the rollout's starting state: --force), 8 the router unreachable, the stable DOWN or
    the canary not answering.
    """
    from qlift.rollout import RolloutInputs, build_spec, read_spec_file, run
    from qlift.rollout.api import raise_for_outcome
    from qlift.rollout.status import rollout_status
    from qlift.settings import router_token

    canary_adapter, next_version = flags.pop("canary_adapter"), flags.pop("next_version")
    new, allow_stable_down, force = (bool(flags.pop(k)) for k in ("new", "allow_stable_down", "force"))
    allow_small_windows = bool(flags.pop("allow_small_windows"))
    overrides: dict[str, Any] = {"backends": _parse_backends(backends), "shadow.percent": flags.pop("shadow_percent"),
                                 **spec_overrides(flags)}
    _fleet_overrides(overrides)
    if overrides["routers"] and (canary_adapter or next_version):
        from qlift.errors import BadInputError

        raise BadInputError(f"{'--next' if next_version else '--canary-adapter'} works through one router, not a "
                            "fleet", field="--router", hint="Give one --router with it.")
    if prometheus_url:
        overrides.update({"provider": "prometheus", "prometheus.url": prometheus_url})
    file_data = read_spec_file(spec_file) if spec_file else {}
    if overrides["backends"] and isinstance(file_data.get("backends"), dict):
        overrides["backends"] = {**file_data["backends"], **overrides["backends"]}
    nxt = None
    if next_version:
        from qlift.rollout.train import next_spec, parse_next

        if canary_adapter:
            from qlift.errors import BadInputError

            raise BadInputError("--next adds a server's backend; --canary-adapter loads an adapter into the "
                                "stable's server: give one of them", field="--next")
        nxt = parse_next(next_version)
        spec = next_spec(file_data, overrides, nxt, journal_path=journal, router_token=router_token(),
                         path=spec_file)
    else:
        spec = build_spec(file_data, overrides, path=spec_file)
    if metrics_port is not None:
        from qlift.rollout.api import default_journal
        from qlift.rollout.exporter import serve_metrics

        serve_metrics(journal or default_journal(), metrics_port)
    adapter = None
    if canary_adapter:
        from qlift.serve.lora import parse_lora_flag

        adapter = parse_lora_flag(canary_adapter, flag="--canary-adapter")
    if nxt is not None:
        from qlift.rollout.train import start_next

        final = start_next(spec, journal, nxt, allow_stable_down=allow_stable_down, force=force,
                           spec_file=spec_file, router_token=router_token(), allow_small_windows=allow_small_windows)
    else:
        final = run(RolloutInputs(journal, new=new, allow_stable_down=allow_stable_down, force=force,
                                  allow_small_windows=allow_small_windows, canary_adapter=adapter,
                                  spec_file=spec_file, router_token=router_token()), spec)
    st = rollout_status(journal)
    emit(st, lambda: _show(st))
    raise_for_outcome(final, journal)


rollout_option = click.option("--rollout", "rollout_id", type=int, default=None, metavar="ID",
                              help="A rollout of the journal by its id (default: the latest).")


@promote_group.command("status", epilog="""\b
Examples:
  qlift promote status
  qlift promote status --rollout 2 --journal rollouts.sqlite
  qlift promote status --json | jq '.state, .weights'
""")
@journal_option
@rollout_option
@json_option
def status_cmd(journal: Path | None, rollout_id: int | None) -> None:
    """Show a rollout: state, weights, and each window with every check's ratio against its limit.

    One line per window (when, decision, requests and errors of both versions), then each
    check as `latency 1.20x/1.5 ok` (ok, hold or FAIL), then the window's notes. --json has
    every number. A journal or rollout that is not there exits 4.
    """
    from qlift.rollout.status import rollout_status

    st = rollout_status(journal, rollout_id)
    emit(st, lambda: _show(st))


@promote_group.command("report", epilog="""\b
Examples:
  qlift promote report -o rollout.html
  qlift promote report --journal rollouts.sqlite --rollout 2 -o rollout-2.html --force
  qlift promote report -o rollout.html --json      # {"report": "rollout.html", ...}
""")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), required=True,
              help="The HTML file to write (one self-contained page: no scripts, nothing fetched).")
@click.option("--force", is_flag=True, help="Replace an existing file.")
@journal_option
@rollout_option
@json_option
def report_cmd(out: Path, force: bool, journal: Path | None, rollout_id: int | None) -> None:
    """Write a rollout as an HTML page: weights over time, each window's verdict, canary vs stable
    latency and TTFT with the limits, each check's ratio per window, why it ended, and the answers
    the failing checks kept. What a release engineer attaches to a change ticket.
    """
    from qlift.rollout.report import write_report

    written = write_report(out, journal, rollout_id, force=force)
    emit(written, lambda: click.echo(f"report: {written['report']} (rollout {written['rollout']}, "
                                     f"{written['state']}, {written['windows']} windows)"))


def _control(name: str, doc: str, example: str) -> None:
    @promote_group.command(name, help=doc, epilog=f"\b\nExamples:\n  {example}\n  {example} --json\n")
    @journal_option
    @json_option
    def cmd(journal: Path | None) -> None:
        import qlift.rollout as rollout
        from qlift.rollout.api import raise_for_outcome
        from qlift.rollout.status import rollout_status

        fn = {"pause": rollout.pause, "resume": rollout.resume, "abort": rollout.abort,
              "promote": rollout.promote_now}[name]
        final = fn(journal)
        st = rollout_status(journal)
        emit(st, lambda: _show(st))
        if name == "resume":
            raise_for_outcome(final, journal)


_control("pause", "Pause the rollout: weights stay; no window is judged until `resume`.", "qlift promote pause")
_control("resume", "Resume a paused (or crashed) rollout, or retry an abort the data plane did not confirm; runs "
         "the controller here if none is running.", "qlift promote resume")
_control("abort", "Abort: 100% stable journaled (abort_requested), applied, then aborted once the data plane "
         "confirms; run it again if the data plane was unreachable. On a full disk the weights are restored first "
         "and the abort journaled by the next `abort`.", "qlift promote abort")
_control("promote", "Promote now: 100% canary, skipping the remaining analysis (recorded as manual).",
         "qlift promote promote")


@promote_group.command("finish", epilog="""\b
Examples:
  qlift promote start -f rollout.yaml --bake 3   # ... baked: the canary has 100%, the stable still runs
  qlift promote finish
  qlift promote finish --journal rollouts.sqlite --json
""")
@journal_option
@json_option
def finish_cmd(journal: Path | None) -> None:
    """Release the stable of a baked rollout (`start --bake N` passed): state finished.

    Until then the stable keeps running at weight 0, and `abort` still returns every user
    to it. The weights stay 100% canary; after this, stop the stable's server when you like
    (a `start --next` rollout's stable is retired from the router here).
    Refused (exit 1) for a rollout still baking, rolled back, or promoted without a bake;
    a journal that is not there exits 4.
    """
    from qlift.rollout.api import finish
    from qlift.rollout.status import rollout_status

    finish(journal)
    st = rollout_status(journal)
    emit(st, lambda: _show(st))


def _show(st: RolloutStatus) -> None:
    from qlift.rollout.view import status_lines

    for line in status_lines(st):
        click.echo(line)
