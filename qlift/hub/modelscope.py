"""ModelScope through its SDK (modelscope 1.40 delegates to modelscope_hub, used here)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, ExternalToolError, NotFoundError, QliftError
from qlift.hub.files import RemoteFile, RepoSnapshot, translated_errors

_COMMIT = re.compile(r"[0-9a-f]{40}")


class ModelScopeSource:
    name = "modelscope"

    def __init__(self, *, endpoint: str | None, token: str | None) -> None:
        try:
            from modelscope_hub.api import HubApi
            from modelscope_hub.config import HubConfig
        except ImportError as exc:
            raise BadInputError(
                "--source modelscope needs the modelscope SDK, which is not installed",
                hint="pip install 'modelscope>=1.40' (or qlift[ml]).",
            ) from exc

        # A fresh config, not the SDK's process-wide one, so the environment is read now.
        # endpoint None: MODELSCOPE_ENDPOINT / MODELSCOPE_DOMAIN / the default;
        # token None: MODELSCOPE_API_TOKEN or the SDK's stored login.
        self._api = HubApi(config=HubConfig(endpoint=endpoint, token=token))
        self.endpoint: str = self._api.legacy.endpoint

    def resolve(self, repo: str, revision: str | None) -> RepoSnapshot:
        rev = revision or "master"
        with translated_errors(_translate, repo, rev, self.endpoint):
            raw = self._api.legacy.list_repo_files(repo_id=repo, repo_type="model", revision=rev, recursive=True)
        entries = [e for e in raw if (e.get("Type") or "blob") == "blob"]
        commit = rev if _COMMIT.fullmatch(rev) else _head_commit(entries)
        if not commit:
            raise ExternalToolError(
                f"{self.endpoint} published no commit id for {repo}@{rev}",
                hint="Pass --revision COMMIT to pin it.", tool="modelscope",
            )
        files = [
            RemoteFile(
                path=str(e.get("Path") or e.get("Name") or ""),
                size=int(e["Size"]) if e.get("Size") is not None else None,
                sha256=(e.get("Sha256") or None),
                lfs=bool(e.get("IsLFS")),
            )
            for e in entries
        ]
        return RepoSnapshot("modelscope", self.endpoint, repo, rev, commit, files)

    def fetch(self, snap: RepoSnapshot, f: RemoteFile, root: Path, *, force: bool) -> Path:
        if force:
            self.discard(root, f.path)
        with translated_errors(_translate, snap.repo, snap.commit, self.endpoint):
            # qlift checks the sha256 itself (so the retry policy is the same on both hubs);
            # the SDK checks the size and resumes partial files from <file>.incomplete.
            return Path(self._api.download_file(
                snap.repo, "model", f.path, revision=snap.commit, local_dir=root,
                cache_dir=root / ".cache" / "modelscope", force=force, file_size=f.size,
            ))

    def discard(self, root: Path, path: str) -> None:
        (root / path).unlink(missing_ok=True)
        (root / (path + ".incomplete")).unlink(missing_ok=True)


def _head_commit(entries: list[dict[str, Any]]) -> str:
    """ModelScope lists each file's last commit; the newest of those is the revision's head."""
    dated = [(int(e.get("CommittedDate") or 0), str(e.get("Revision") or "")) for e in entries]
    dated = [d for d in dated if _COMMIT.fullmatch(d[1])]
    return max(dated)[1] if dated else ""


def _translate(exc: Exception, repo: str, rev: str, endpoint: str) -> QliftError | None:
    import requests
    from modelscope_hub import errors as ms

    if isinstance(exc, ms.NotExistError):
        return NotFoundError(
            f"{repo}@{rev} not found on {endpoint}",
            hint="Check the id and --revision (ModelScope's default branch is master).",
        )
    if isinstance(exc, (ms.AuthenticationError, ms.PermissionDeniedError)):
        return ExternalToolError(
            f"{endpoint} refused {repo}: {type(exc).__name__}",
            hint="Give a token with --token-env NAME or MODELSCOPE_API_TOKEN.", tool="modelscope",
        )
    if isinstance(exc, ms.FileIntegrityError):
        return ExternalToolError(
            f"transfer from {repo}@{rev} was cut short or oversized: {exc}", tool="modelscope",
        )
    unavailable = (ms.NetworkError, ms.ServerError, ms.RateLimitError, requests.RequestException, ConnectionError)
    if isinstance(exc, unavailable):
        return ExternalToolError(
            f"cannot reach {endpoint} for {repo}: {type(exc).__name__}",
            hint="Check the network or MODELSCOPE_ENDPOINT, or use --source hf.", tool="modelscope",
        )
    if isinstance(exc, ms.HubError):
        return ExternalToolError(f"{endpoint} failed for {repo}: {exc}", tool="modelscope")
    return None
