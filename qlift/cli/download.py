"""qlift download and qlift verify."""

from __future__ import annotations

import os
from pathlib import Path

import click

from qlift.cli.output import emit, human_bytes, json_option
from qlift.cli.params import URL, count


@click.command("download")
@click.argument("repo_id")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Output directory (default: ./NAME).")
@click.option("--source", type=click.Choice(["hf", "modelscope", "auto"]), default="hf", show_default=True,
              help="Hub to use; auto tries Hugging Face, then ModelScope when the Hub is unreachable.")
@click.option("--revision", help="Branch, tag or commit (default: main on the Hub, master on ModelScope).")
@click.option("--include", multiple=True, metavar="GLOB",
              help="Only files matching GLOB (path or base name); repeatable. Replaces the defaults.")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Skip files matching GLOB; repeatable.")
@click.option("--endpoint", metavar="URL", type=URL,
              help="Hub URL (a mirror); default HF_ENDPOINT or the SDK's ModelScope endpoint.")
@click.option("--token-env", metavar="NAME",
              help="Read the access token from environment variable NAME (default: the client's own login).")
@click.option("--max-workers", type=count(1, 64), default=8, show_default=True, help="Files fetched in parallel.")
@click.option("--dry-run", is_flag=True, help="List files, total size and free disk; download nothing.")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@json_option
def download_cmd(
    repo_id: str, output: Path | None, source: str, revision: str | None, include: tuple[str, ...],
    exclude: tuple[str, ...], endpoint: str | None, token_env: str | None, max_workers: int,
    dry_run: bool, force: bool,
) -> None:
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
    from qlift.errors import BadInputError
    from qlift.hub import download

    token = None
    if token_env:
        token = os.environ.get(token_env)
        if not token:
            raise BadInputError(f"environment variable {token_env} is not set or empty",
                                hint=f"Export {token_env} with your access token, or drop --token-env.")
    r = download(
        repo_id, output=output, source=source, revision=revision, include=list(include),
        exclude=list(exclude), endpoint=endpoint, token=token, max_workers=max_workers,
        dry_run=dry_run, force=force,
    )

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
