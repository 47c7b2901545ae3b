"""qlift release: run a whole release from one file, cached by content and resumable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from qlift.cli.output import STATE, emit, json_option

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
@json_option
def run_cmd(file: Path, dry_run: bool, from_stage: str | None, out: Path | None) -> None:
    """Run the release in FILE (default: ./release.yaml), one progress line per stage.

    \b
    Examples:
      qlift release run examples/release.yaml
      qlift release run release.yaml --dry-run
      qlift release run release.yaml --from quantize --json
    """
    from qlift.errors import QliftError
    from qlift.release import load_release, run_release

    release = _with_out(load_release(file), out)
    reports: list[Any] = []
    try:
        run_release(release, from_stage=from_stage, dry_run=dry_run, echo=_progress, reports=reports)
    except QliftError as exc:
        if STATE.json:  # the stages so far, the failed one last, before the error line
            emit({"release": release.name, "file": str(file), "out": str(release.out), "dry_run": dry_run,
                  "stages": reports, "error": exc.one_line()})
        raise
    def human() -> None:
        counts = {a: sum(1 for r in reports if r.action == a) for a in ("ran", "skipped", "run", "skip", "blocked")}
        said = ", ".join(f"{n} {a}" for a, n in counts.items() if n)
        click.echo(f"release {release.name}{' (plan)' if dry_run else ''}: {said}; outputs in {release.out}")

    emit({"release": release.name, "file": str(file), "out": str(release.out), "dry_run": dry_run,
          "stages": reports}, human)


def _with_out(release: Any, out: Path | None) -> Any:
    import dataclasses

    return release if out is None else dataclasses.replace(release, out=out.resolve(), out_from="--out")


def _progress(line: str) -> None:
    if not STATE.quiet:
        click.echo(line, err=True)


@release_group.command("status")
@FILE
@OUT
@json_option
def status_cmd(file: Path, out: Path | None) -> None:
    """Each stage's state in FILE's journal: its current key, last state, output and when.

    \b
    Examples:
      qlift release status examples/release.yaml
      qlift release status --json
    """
    from qlift.release import load_release
    from qlift.release.journal import NAME, ReleaseJournal, run_outcome

    release = _with_out(load_release(file), out)
    path = release.out / NAME
    stages: list[dict[str, Any]] = []
    last_run = None
    if path.exists():
        with ReleaseJournal(path, readonly=True) as journal:
            last_run = journal.last_run()
            if last_run is not None:
                last_run["outcome"] = run_outcome(path, last_run)
            for name in ["base", *(s.name for s in release.stages)]:
                row = journal.latest(name)
                stages.append({"name": name, **({k: row[k] for k in ("status", "key", "output", "content_hash",
                                                                      "started_at", "finished_at")} if row else
                                                 {"status": "never run"})})
        if last_run is not None and str(last_run["outcome"]).startswith("killed"):
            for s in stages:  # its process is gone: what it was doing will not finish by itself
                if s["status"] == "running":
                    s["status"] = "interrupted"
    else:
        stages = [{"name": n, "status": "never run"} for n in ["base", *(s.name for s in release.stages)]]

    def human() -> None:
        if last_run:
            click.echo(f"last run {last_run['started_at']}: {last_run['outcome']} {last_run['detail']}".rstrip())
        for s in stages:
            key = s.get("key", "").removeprefix("sha256:")[:12]
            click.echo(f"{s['name']:<16} {s['status']:<11} {key:<12} {s.get('output', '')}".rstrip())

    emit({"release": release.name, "journal": str(path), "last_run": last_run, "stages": stages}, human)


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
