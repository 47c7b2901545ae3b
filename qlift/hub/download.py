"""qlift download: resolve a repo to a commit, fetch the chosen files, verify every byte.

Files land in a staging dir beside the output (``.OUT.qlift-download``) whose
``state.json`` records every file that verified; a rerun after a kill skips those and the
clients resume the rest. Only when every file verified is the output assembled (hard
links from the staging dir, which is removed after), the lockfile and lineage manifest
written, and the whole renamed into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from qlift import progress, settings
from qlift.errors import BadInputError, ExternalToolError, IncompatibleError, IntegrityError, QliftError
from qlift.fsutil import atomic_output_dir, check_output_path, link_or_copy, sha256_file, write_json_atomic
from qlift.hub.files import RemoteFile, RepoSnapshot, check_safe_path, git_blob_id, select_files
from qlift.hub.lock import LOCK_NAME, Lock, LockedFile, local_path, write_lock
from qlift.hub.options import SOURCES, DownloadOptions
from qlift.lineage import utc_now, write_manifest
from qlift.models.ref import ModelRef
from qlift.threads import map_unordered

log = logging.getLogger("qlift.hub")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


class Source(Protocol):
    name: str
    endpoint: str

    def resolve(self, repo: str, revision: str | None) -> RepoSnapshot: ...
    def fetch(self, snap: RepoSnapshot, f: RemoteFile, root: Path, *, force: bool) -> Path: ...
    def discard(self, root: Path, path: str) -> None: ...


@dataclass
class DownloadResult:
    output: str
    source: str
    endpoint: str
    repo: str
    revision: str
    commit: str
    files: list[LockedFile | RemoteFile]
    total_bytes: int
    free_bytes: int
    fits: bool
    dry_run: bool = False
    fetched: int = 0  # files transferred by this run
    reused: int = 0  # files a killed earlier run had already verified
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    model_ref: ModelRef | None = None  # the output once written, hashed once (from its qlift.json's records)


def open_source(name: str, *, endpoint: str | None, token: str | None) -> Source:
    if name == "hf":
        from qlift.hub.hf import HfSource

        return HfSource(endpoint=endpoint or settings.hf_endpoint(), token=token)
    from qlift.hub.modelscope import ModelScopeSource

    return ModelScopeSource(endpoint=endpoint, token=token)


def resolve(
    repo: str, *, source: str, revision: str | None, endpoint: str | None, token: str | None
) -> tuple[Source, RepoSnapshot, list[str]]:
    """Resolve ``revision`` to a commit; with ``source="auto"`` fall back to ModelScope when the
    Hugging Face endpoint is unreachable (not when the repo or revision does not exist)."""
    if source not in SOURCES:
        raise BadInputError(f"unknown source {source!r}", hint=f"Use one of {', '.join(SOURCES)}.")
    if source != "auto":
        src = open_source(source, endpoint=endpoint, token=token)
        return src, src.resolve(repo, revision), []
    hf = open_source("hf", endpoint=endpoint, token=token)
    try:
        return hf, hf.resolve(repo, revision), []
    except ExternalToolError as exc:
        note = f"{exc.message}; trying ModelScope for {repo}"
        log.warning(note)
    # The token given for the Hub is not sent to another service; ModelScope uses its own login.
    ms = open_source("modelscope", endpoint=None, token=None)
    return ms, ms.resolve(repo, revision if revision not in (None, "main") else None), [note]


def check_repo_id(repo: str) -> None:
    """OWNER/NAME as the hubs accept it (huggingface_hub's own validator: no name starting or
    ending with '.' or '-', no '--' or '..', at most 96 characters), refused before any request."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
        ok = bool(_REPO_ID.fullmatch(repo))
    except HFValidationError:
        ok = False
    if not ok:
        raise BadInputError(f"{repo!r} is not a repo id (letters, digits, '-', '_' and '.'; no name starting or "
                            "ending with '-' or '.', no '--' or '..', at most 96 characters)",
                            hint="Use OWNER/NAME, e.g. Qwen/Qwen2.5-0.5B-Instruct.")


def download(repo: str, options: DownloadOptions | None = None) -> DownloadResult:
    opts = options or DownloadOptions()
    started, t0 = utc_now(), time.monotonic()
    token = opts.token()
    check_repo_id(repo)
    out = opts.output if opts.output is not None else Path(repo.rsplit("/", 1)[-1])
    check_output_path(out, force=opts.force)

    src, snap, notes = resolve(repo, source=opts.source, revision=opts.revision, endpoint=opts.endpoint, token=token)
    log.info("%s@%s is commit %s on %s (%s)", repo, snap.revision, snap.commit, snap.source, snap.endpoint)
    for f in snap.files:
        check_safe_path(f.path)
    chosen, select_notes = select_files(snap.files, include=list(opts.include), exclude=list(opts.exclude))
    notes += select_notes
    for n in select_notes:
        log.info(n)
    if not chosen:
        listed = ", ".join(f.path for f in snap.files[:8]) or "none"
        raise BadInputError(
            f"no file of {repo}@{snap.commit[:12]} matches the include/exclude patterns (files: {listed})",
            hint="Adjust --include / --exclude; --dry-run lists what would be taken.",
        )

    staging = out.parent / f".{out.name}.qlift-download"
    state = _State.load(staging)
    done = {f.path: rec for f in chosen if (rec := state.verified(staging, f, snap.commit)) is not None}
    total = sum(f.size or 0 for f in chosen)
    remaining = sum(f.size or 0 for f in chosen if f.path not in done)
    free = shutil.disk_usage(_existing(out.parent)).free
    result = DownloadResult(
        output=str(out), source=snap.source, endpoint=snap.endpoint, repo=repo, revision=snap.revision,
        commit=snap.commit, files=list(chosen), total_bytes=total, free_bytes=free,
        fits=free >= remaining, dry_run=opts.dry_run, reused=len(done), notes=notes,
    )
    if opts.dry_run:
        return result
    if not result.fits:
        raise IncompatibleError(
            f"{repo} needs {remaining:,} more bytes but {out.parent.resolve()} has {free:,} free",
            hint="Free disk space or choose -o on a larger disk; --dry-run shows the file list.",
        )

    with _exclusive(staging, out):
        records = dict(done)
        todo = [f for f in chosen if f.path not in done]
        if done:
            log.info("resuming: %d file(s) already verified, %d to fetch", len(done), len(todo))
        records.update(_fetch_all(src, snap, todo, staging, state, max_workers=opts.max_workers))
        result.fetched = len(todo)
        placed = [_placed(records[f.path]) for f in chosen]
        lock = Lock(snap.source, snap.endpoint, repo, snap.revision, snap.commit, placed)
        with atomic_output_dir(out, force=opts.force) as tmp:
            for rec in placed:
                (tmp / rec.path).parent.mkdir(parents=True, exist_ok=True)
                link_or_copy(staging / (rec.repo_path or rec.path), tmp / rec.path)
            write_lock(tmp, lock)
            manifest = write_manifest(tmp, operation="download", inputs={}, started_at=started, parameters={
                "repo": repo, "source": snap.source, "endpoint": snap.endpoint, "revision": snap.revision,
                "commit": snap.commit, "include": list(opts.include), "exclude": list(opts.exclude),
                "lockfile": LOCK_NAME,
            })
    shutil.rmtree(staging, ignore_errors=True)
    result.files = list(lock.files)
    result.model_ref = ModelRef.written(out, manifest.outputs)
    result.seconds = round(time.monotonic() - t0, 2)
    return result


def _fetch_all(
    src: Source, snap: RepoSnapshot, todo: list[RemoteFile], staging: Path, state: _State, *, max_workers: int
) -> dict[str, LockedFile]:
    records: dict[str, LockedFile] = {}
    bar = progress.byte_bar(sum(f.size or 0 for f in todo), desc="total")

    def one(f: RemoteFile) -> LockedFile:
        rec, blob_id = _fetch_verified(src, snap, f, staging)
        state.add(staging, rec, blob_id, snap.commit)  # at once, so a killed run's rerun skips it
        bar.update(rec.size)
        return rec

    with _library_bars(enabled=not bar.disable):
        try:
            # The first failure starts no new file but lets those in flight finish and be
            # journaled, so the rerun fetches only what failed; Ctrl-C or SIGTERM stops at once
            # (a file in flight keeps its partial bytes in staging for the resume).
            for _, rec in map_unordered(one, todo, workers=max_workers, name="qlift-download",
                                        finish_started=True):
                records[rec.path] = rec
        finally:
            bar.close()
    return records


def _fetch_verified(src: Source, snap: RepoSnapshot, f: RemoteFile, staging: Path) -> tuple[LockedFile, str | None]:
    """Fetch one file and check it against what the hub publishes; one more try, then an error."""
    problem = ""
    for attempt in (1, 2):
        try:
            path = src.fetch(snap, f, staging, force=attempt > 1)
            rec, blob_id, problem = _check(path, f)
        except ExternalToolError as exc:
            src.discard(staging, f.path)
            if attempt == 2:
                raise
            problem = exc.message
        else:
            if not problem:
                return rec, blob_id
            src.discard(staging, f.path)  # never leave a bad file looking finished
        if attempt == 1:
            log.warning("%s: %s; fetching it again", f.path, problem)
    raise IntegrityError(
        f"{f.path} from {snap.repo}@{snap.commit[:12]} failed verification twice: {problem}",
        hint="The hub or a proxy serves corrupt data; retry later or try another --source / --endpoint.",
    )


def _placed(rec: LockedFile) -> LockedFile:
    where = local_path(rec.path)
    if where == rec.path:
        return rec
    log.info("the repo holds its own %s; kept as %s (qlift writes its own there)", rec.path, where)
    return LockedFile(where, rec.size, rec.sha256, repo_path=rec.path)


def _check(path: Path, f: RemoteFile) -> tuple[LockedFile, str | None, str]:
    size = path.stat().st_size
    sha = sha256_file(path)
    rec = LockedFile(f.path, size, sha)
    blob_id = git_blob_id(path) if f.blob_id else None
    if f.size is not None and size != f.size:
        return rec, blob_id, f"got {size} bytes, the hub lists {f.size}"
    if f.sha256 and sha != f.sha256.lower():
        return rec, blob_id, f"sha256 {sha[:16]}… differs from the published {f.sha256[:16]}…"
    if f.blob_id and blob_id != f.blob_id:
        return rec, blob_id, f"git blob id {blob_id} differs from the published {f.blob_id}"
    if not (f.sha256 or f.blob_id):
        log.warning("%s: the hub publishes no hash for it; recorded its sha256 only", f.path)
    return rec, blob_id, ""


class _State:
    """Files in the staging dir that verified, keyed by path, with the stat that proves it."""

    def __init__(self, files: dict[str, dict[str, Any]]) -> None:
        self.files = files
        self._lock = threading.Lock()

    @classmethod
    def load(cls, staging: Path) -> _State:
        try:
            data = json.loads((staging / "state.json").read_text(encoding="utf-8"))
            return cls(dict(data["files"]))
        except (OSError, ValueError, KeyError, TypeError):
            return cls({})

    def verified(self, staging: Path, f: RemoteFile, commit: str) -> LockedFile | None:
        rec = self.files.get(f.path)
        p = staging / f.path
        if not rec or not p.is_file():
            return None
        st = p.stat()
        untouched = st.st_size == rec["size"] and st.st_mtime_ns == rec["mtime_ns"]
        if f.sha256 or f.blob_id:  # content-addressed: valid for any commit publishing the same hash
            same = (
                (f.size is None or f.size == rec["size"])
                and (not f.sha256 or f.sha256.lower() == rec["sha256"])
                and (not f.blob_id or f.blob_id == rec.get("blob_id"))
            )
        else:
            same = rec.get("commit") == commit
        return LockedFile(f.path, rec["size"], rec["sha256"]) if untouched and same else None

    def add(self, staging: Path, rec: LockedFile, blob_id: str | None, commit: str) -> None:
        with self._lock:
            mtime = (staging / rec.path).stat().st_mtime_ns
            self.files[rec.path] = {"size": rec.size, "sha256": rec.sha256, "blob_id": blob_id,
                                    "commit": commit, "mtime_ns": mtime}
            write_json_atomic(staging / "state.json", {"files": self.files}, indent=1)


@contextlib.contextmanager
def _exclusive(staging: Path, out: Path) -> Iterator[None]:
    staging.mkdir(parents=True, exist_ok=True)
    with open(staging / ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise QliftError(
                f"another qlift download is writing {out}",
                hint="Wait for it to finish, or download to another -o path.",
            ) from None
        yield


@contextlib.contextmanager
def _library_bars(*, enabled: bool) -> Iterator[None]:
    """Per-file bars come from the hub clients; silence them when qlift's bars are off."""
    if enabled:
        yield
        return
    import functools

    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    # modelscope_hub draws a tqdm bar per file and offers no switch (TQDM_DISABLE is read
    # only when tqdm is imported), so hand it a disabled tqdm for the duration.
    ms_download = _loaded_module("modelscope_hub._download")
    ms_tqdm = getattr(ms_download, "tqdm", None)
    if ms_tqdm is not None:
        ms_download.tqdm = functools.partial(ms_tqdm, disable=True)  # type: ignore[union-attr]
    try:
        yield
    finally:
        if not was_disabled:
            enable_progress_bars()
        if ms_tqdm is not None:
            ms_download.tqdm = ms_tqdm  # type: ignore[union-attr]


def _loaded_module(name: str) -> Any:
    import sys

    return sys.modules.get(name)


def _existing(path: Path) -> Path:
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path
