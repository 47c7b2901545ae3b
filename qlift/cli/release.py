"""qlift release: run a whole release from one file, cached by content and resumable."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from qlift.cli.output import STATE, emit, json_option

if TYPE_CHECKING:
    from qlift.release.report import StageReport
    from qlift.release.spec import Release

GROUP_EPILOG = """\b
Examples:
  qlift release run examples/release.yaml              # every stage; cached ones are skipped
  qlift release run release.yaml --dry-run             # the plan: run / skip (cached KEY) / blocked
  qlift release run release.yaml --from eval           # run eval and what follows again
  qlift release status release.yaml --json             # each stage's last key, state and output
  qlift release schema > release.schema.json           # for editors
"""

FILE = click.argument("file", type=click.Path(path_type=Path, dir_okay=False), default=Path("release.yaml"),
                      required=False)
OUT = click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
                   help="Outputs and journal here instead of the file's `out:` (a second copy of the release).")


@click.group("release", epilog=GROUP_EPILOG)
def release_group() -> None:
    """A release as one declarative file: import, merge, quantize, eval, serve, promote.

    Each stage's options are that stage's own options model (`qlift release schema`). A
    stage whose inputs and options hash to a key it already has an output for, and whose
    output still verifies, is skipped; the state of a run is journaled in OUT/release.sqlite,
    so a killed run continues with `qlift release run` at the stage that did not finish.
    Exit codes: 0 released, 10 a gate failed or the rollout rolled back, 2 a bad file.
    """


@release_group.command("run")
@FILE
@click.option("--dry-run", is_flag=True, help="Print the plan (run / skip (cached KEY) / blocked) and run nothing.")
@click.option("--from", "from_stage", metavar="STAGE", default=None,
              help="Run STAGE and every stage after it again, even where cached ('base' for all).")
@OUT
@click.option("--yes", is_flag=True, help="Let promote move the traffic of a router that serves users (a router "
              "stage with url:) without asking; without it a terminal asks, and anything else is refused (exit 2).")
@json_option
def run_cmd(file: Path, dry_run: bool, from_stage: str | None, out: Path | None, yes: bool) -> None:
    """Run the release in FILE (default: ./release.yaml), one progress line per stage.

    \b
    Examples:
      qlift release run examples/release.yaml
      qlift release run release.yaml --dry-run
      qlift release run release.yaml --from quantize --json
      qlift release run prod-release.yaml --yes     # its router stage names a running router (url:)
    """
    from qlift.errors import QliftError
    from qlift.release import load_release, run_release
    from qlift.settings import router_token

    release = _with_out(load_release(file), out)
    reports: list[StageReport] = []
    try:
        run_release(release, from_stage=from_stage, dry_run=dry_run, echo=_progress, reports=reports,
                    confirm=_confirm(yes), router_token=router_token())
    except QliftError as exc:
        if STATE.json:  # the stages so far, the failed one last, before the error line
            emit({"release": release.name, "file": str(file), "out": str(release.out), "dry_run": dry_run,
                  "stages": reports, "error": exc.one_line()})
        raise
    def human() -> None:
        from qlift.release.report import Action

        counts = {a: sum(1 for r in reports if r.action is a)
                  for a in (Action.RAN, Action.SKIPPED, Action.RUN, Action.SKIP, Action.BLOCKED)}
        said = ", ".join(f"{n} {a}" for a, n in counts.items() if n)
        click.echo(f"release {release.name}{' (plan)' if dry_run else ''}: {said}; outputs in {release.out}")

    emit({"release": release.name, "file": str(file), "out": str(release.out), "dry_run": dry_run,
          "stages": reports}, human)


def _with_out(release: Release, out: Path | None) -> Release:
    import dataclasses

    return release if out is None else dataclasses.replace(release, out=out.resolve(), out_from="--out")


def _confirm(yes: bool) -> Callable[[str], bool] | None:
    """How promote is let move a production router's traffic: --yes, else a question on a terminal, else not."""
    if yes:
        return lambda question: True
    if sys.stdin.isatty() and sys.stderr.isatty():
        return lambda question: click.confirm(question, default=False, err=True)
    return None


def _progress(line: str) -> None:
    if not STATE.quiet:
        click.echo(line, err=True)


@release_group.command("status")
@FILE
@OUT
@json_option
def status_cmd(file: Path, out: Path | None) -> None:
    """The last run, each stage's state in FILE's journal (key, duration, output), and the rollout's
    outcome, reason and journal.

    \b
    Examples:
      qlift release status examples/release.yaml
      qlift release status --json
    """
    from qlift.release import load_release
    from qlift.release.status import release_status, status_lines

    status = release_status(_with_out(load_release(file), out), echo=_progress)

    def human() -> None:
        for line in status_lines(status):
            click.echo(line)

    emit(status, human)


@release_group.command("schema")
@json_option
def schema_cmd() -> None:
    """Print the JSON Schema of a release file (every stage's options model spelled out; it is JSON
    with or without --json).

    \b
    Examples:
      qlift release schema > release.schema.json
    """
    from qlift.release import json_schema

    click.echo(json.dumps(json_schema(), indent=2))
