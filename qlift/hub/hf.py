"""The Hugging Face Hub (or a mirror speaking its API) through huggingface_hub."""

from __future__ import annotations

import logging
from pathlib import Path

from qlift.errors import BadInputError, ExternalToolError, NotFoundError, QliftError
from qlift.hub.files import RemoteFile, RepoSnapshot, translated_errors

log = logging.getLogger("qlift.hub")
DEFAULT_ENDPOINT = "https://huggingface.co"


class HfSource:
    name = "hf"

    def __init__(self, *, endpoint: str | None, token: str | None) -> None:
        self.endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        # None lets huggingface_hub use HF_TOKEN or its stored login.
        self._token = token

    def resolve(self, repo: str, revision: str | None) -> RepoSnapshot:
        from huggingface_hub import HfApi, constants

        if constants.HF_HUB_OFFLINE:
            raise BadInputError(
                "HF_HUB_OFFLINE is set, so huggingface_hub will not contact the hub",
                hint="Unset HF_HUB_OFFLINE to download.",
            )
        rev = revision or "main"
        api = HfApi(endpoint=self.endpoint, token=self._token)
        with translated_errors(_translate, repo, rev, self.endpoint):
            info = api.model_info(repo, revision=rev, files_metadata=True)
        if not info.sha:
            raise ExternalToolError(
                f"{self.endpoint} answered without a commit sha for {repo}@{rev}",
                hint="Is --endpoint a Hugging Face Hub compatible server?", tool="hf",
            )
        files = [
            RemoteFile(
                path=s.rfilename,
                size=s.lfs.size if s.lfs else s.size,
                sha256=s.lfs.sha256 if s.lfs else None,
                blob_id=None if s.lfs else s.blob_id,
                lfs=s.lfs is not None,
            )
            for s in info.siblings or []
        ]
        return RepoSnapshot("hf", self.endpoint, repo, rev, info.sha, files)

    def fetch(self, snap: RepoSnapshot, f: RemoteFile, root: Path, *, force: bool) -> Path:
        from huggingface_hub import hf_hub_download

        if force:
            _forget(root, f.path)
        with translated_errors(_translate, snap.repo, snap.commit, self.endpoint):
            path = hf_hub_download(
                snap.repo, f.path, revision=snap.commit, local_dir=root,
                endpoint=self.endpoint, token=self._token, force_download=force,
            )
        return Path(str(path))

    def discard(self, root: Path, path: str) -> None:
        _forget(root, path)


def _forget(root: Path, path: str) -> None:
    """Remove a file and huggingface_hub's local-dir metadata, so it is fetched anew."""
    (root / path).unlink(missing_ok=True)
    meta = root / ".cache" / "huggingface" / "download" / (path + ".metadata")
    meta.unlink(missing_ok=True)


def _transport_errors() -> tuple[type[Exception], ...]:
    """Connection errors of the HTTP client huggingface_hub uses: httpx2 from 2.0, httpx before
    (httpx is qlift's own dependency; httpx2 comes only with huggingface_hub 2)."""
    import httpx

    errors: list[type[Exception]] = [httpx.TransportError]
    try:
        import httpx2
    except ImportError:
        return tuple(errors)
    return (*errors, httpx2.TransportError)


def _translate(exc: Exception, repo: str, rev: str, endpoint: str) -> QliftError | None:
    from huggingface_hub import errors as hf

    where = f"{repo}@{rev} on {endpoint}"
    if isinstance(exc, hf.GatedRepoError):
        return NotFoundError(
            f"{repo} is gated on {endpoint}",
            hint="Accept its terms on the hub, then give a token with --token-env NAME or HF_TOKEN.",
        )
    if isinstance(exc, hf.RepositoryNotFoundError):
        return NotFoundError(
            f"repo {repo} not found on {endpoint}",
            hint="Check the id; for a private repo give a token with --token-env NAME or HF_TOKEN.",
        )
    if isinstance(exc, hf.RevisionNotFoundError):
        return NotFoundError(
            f"revision {rev!r} not found in {repo} on {endpoint}",
            hint="Give a branch, tag or commit that exists (--revision).",
        )
    if isinstance(exc, hf.RemoteEntryNotFoundError):
        return NotFoundError(f"a listed file is missing from {where}", hint="Retry; the repo changed.")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    unavailable = isinstance(exc, (*_transport_errors(), hf.LocalEntryNotFoundError, hf.OfflineModeIsEnabled)) or (
        isinstance(exc, hf.HfHubHTTPError) and (status is None or status >= 500 or status == 429)
    )
    if unavailable:
        return ExternalToolError(
            f"cannot reach {endpoint} for {repo}: {type(exc).__name__}",
            hint="Check the network or --endpoint / HF_ENDPOINT, or use --source modelscope.",
            tool="hf",
        )
    if isinstance(exc, hf.HfHubHTTPError):
        return ExternalToolError(
            f"{endpoint} refused {where} (HTTP {status})",
            hint="A 401/403 needs a valid token: --token-env NAME or HF_TOKEN.",
            tool="hf",
        )
    if isinstance(exc, OSError) and exc.errno is None:
        # huggingface_hub's size consistency check: a short or empty transfer.
        return ExternalToolError(f"transfer from {where} was cut short: {exc}", tool="hf")
    return None
