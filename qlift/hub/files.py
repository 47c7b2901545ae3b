"""What a hub publishes about a repo at one commit, and which of its files qlift takes."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from qlift.errors import QliftError, UnsafeInputError

# What a release engineer needs to load and serve a checkpoint.
DEFAULT_INCLUDE = (
    "*.safetensors", "*.safetensors.index.json", "*.json", "*.jinja", "*.txt", "*.model",
    "*.tiktoken", "*.py", "*.md", "LICENSE*", "tokenizer*",
)
PICKLE_WEIGHTS = ("*.bin", "*.pth", "*.pt", "*.pkl", "*.ckpt")


@dataclass
class RemoteFile:
    """One file as the hub publishes it. ``sha256`` for LFS files (Hub) and every file (ModelScope);
    ``blob_id`` (git sha1) for small files on the Hub."""

    path: str
    size: int | None
    sha256: str | None = None
    blob_id: str | None = None
    lfs: bool = False


@dataclass
class RepoSnapshot:
    """A repo resolved to one commit on one hub."""

    source: str  # "hf" or "modelscope"
    endpoint: str
    repo: str
    revision: str  # what the user asked for
    commit: str
    files: list[RemoteFile] = field(default_factory=list)


def check_safe_path(name: str) -> None:
    """Refuse a remote file name that could write outside the download directory."""
    p = PurePosixPath(name)
    bad = (
        not name
        or name.startswith(("/", "\\"))
        or "\\" in name
        or "\0" in name
        or (len(name) > 1 and name[1] == ":")
        or any(part in ("..", ".", "") for part in name.split("/"))
        or p.is_absolute()
    )
    if bad:
        raise UnsafeInputError(
            f"the hub lists a file named {name!r}, which is absolute or leaves the download directory",
            hint="Refusing the whole repo; report it to the repo owner or pick another --endpoint.",
        )


def _matches(path: str, patterns: tuple[str, ...] | list[str]) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(path, pat) or fnmatch.fnmatchcase(name, pat) for pat in patterns)


def select_files(
    files: list[RemoteFile], *, include: list[str], exclude: list[str]
) -> tuple[list[RemoteFile], list[str]]:
    """Apply --include/--exclude (or the defaults); returns the files and notes for the user.

    Without --include: the default set, and pickle weights only when the repo has no
    safetensors weights. A pattern matches the full path or the base name.
    """
    notes: list[str] = []
    if include:
        chosen = [f for f in files if _matches(f.path, include)]
    else:
        chosen = [f for f in files if _matches(f.path, DEFAULT_INCLUDE)]
        pickles = [f for f in files if _matches(f.path, PICKLE_WEIGHTS)]
        has_safetensors = any(f.path.endswith(".safetensors") for f in files)
        if pickles and has_safetensors:
            notes.append(
                f"skipping {len(pickles)} pickle weight file(s) because safetensors exist "
                "(--include '*.bin' to take them)"
            )
        elif pickles:
            chosen += pickles
            notes.append(f"no safetensors in this repo: taking {len(pickles)} pickle weight file(s)")
    chosen = [f for f in chosen if not _matches(f.path, exclude)]
    return sorted(chosen, key=lambda f: f.path), notes


def git_blob_id(path: Path) -> str:
    """The git object id of a file's content (what the Hub publishes for non-LFS files)."""
    size = path.stat().st_size
    digest = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as fh:
        while chunk := fh.read(8 * 1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def translated_errors(
    translate: Callable[[Exception, str, str, str], QliftError | None], repo: str, rev: str, endpoint: str
) -> Iterator[None]:
    """Turn a hub client library's errors into qlift errors naming the repo and endpoint.

    ``translate`` maps one library's exceptions; what it does not know is re-raised as is.
    """
    try:
        yield
    except QliftError:
        raise
    except Exception as exc:
        err = translate(exc, repo, rev, endpoint)
        if err is None:
            raise
        raise err from exc
