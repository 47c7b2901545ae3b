"""qlift download and qlift verify."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from qlift.cli.options import click_options
from qlift.cli.output import emit, human_bytes, json_option
from qlift.hub.options import DownloadOptions


@click.command("download")
@click.argument("repo_id")
@click_options(DownloadOptions)
@json_option
def download_cmd(repo_id: str, **options: Any) -> None:
    """Download REPO_ID pinned to one commit, with every file's sha256 verified.

    The revision is resolved to a commit first; every file comes from that commit and is
    checked against the sha256 (or git blob id) the hub publishes, fetched once more on a
    mismatch, then refused. The output gets qlift.lock.json (source, commit, every file's
    size and sha256) and the lineage manifest. A killed download resumes on rerun.

    By default it takes safetensors, config, tokenizer and chat-template files, and pickle
    weights (*.bin, *.pt, *.pth) only when the repo has no safetensors.

    \b
    Examples:
      qlift download Qwen/Qwen2.5-0.5B-Instruct -o qwen05b
      qlift download Qwen/Qwen2.5-0.5B-Instruct --revision 7ae557604adf67be50417f59c2c2f167def9a775
      qlift download Qwen/Qwen2.5-0.5B-Instruct --source auto --dry-run
      HF_ENDPOINT=https://mirror.example qlift download org/model --token-env MY_HF_TOKEN
    """
    from qlift.hub import DownloadInputs, run

    r = run(DownloadInputs(repo_id), DownloadOptions(**options))

    def human() -> None:
        head = f"{r.repo}@{r.revision} = commit {r.commit} ({r.source}, {r.endpoint})"
        if r.dry_run:
            click.echo(head)
            for f in r.files:
                size = human_bytes(f.size) if f.size is not None else "?"
                click.echo(f"  {size:>10}  {f.path}")
            verdict = "fits" if r.fits else "DOES NOT FIT"
            click.echo(f"{len(r.files)} files, {human_bytes(r.total_bytes)}; "
                       f"{human_bytes(r.free_bytes)} free at {Path(r.output).parent.resolve()}: {verdict}")
            return
        reused = f", {r.reused} verified by an earlier run" if r.reused else ""
        click.echo(f"wrote {r.output}: {len(r.files)} files, {human_bytes(r.total_bytes)} from "
                   f"{r.repo}@{r.commit[:12]} ({r.source}) in {r.seconds:.1f} s{reused}")

    emit(r, human)


@click.command("verify")
@click.argument("directory", type=click.Path(path_type=Path))
@json_option
def verify_cmd(directory: Path) -> None:
    """Re-hash DIRECTORY against its qlift.lock.json, offline.

    Reports files that are missing, changed (size or sha256) or extra (not in the lockfile),
    and exits non-zero if there is any.

    \b
    Examples:
      qlift verify qwen05b
      qlift verify qwen05b --json | jq .changed
    """
    from qlift.errors import IntegrityError
    from qlift.hub import verify_dir

    r = verify_dir(directory)

    def human() -> None:
        for label, paths in (("missing", r.missing), ("changed", r.changed), ("extra", r.extra)):
            for p in paths:
                click.echo(f"{label:8} {p}")
        if r.ok:
            click.echo(f"ok: {r.checked} files, {human_bytes(r.total_bytes)} match {r.repo}@{r.commit[:12]}")

    emit(r, human)
    if not r.ok:
        counts = ", ".join(f"{len(v)} {k}" for k, v in
                           (("missing", r.missing), ("changed", r.changed), ("extra", r.extra)) if v)
        first = (r.missing + r.changed + r.extra)[0]
        raise IntegrityError(
            f"{directory} does not match its lockfile: {counts} (first: {first})",
            hint="Download it again (qlift download --force), or restore the changed files.",
        )
