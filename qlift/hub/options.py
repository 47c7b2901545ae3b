"""What a download can be asked to do besides REPO_ID: the one definition ``download`` takes and
``qlift download``'s options are generated from."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from qlift.errors import BadInputError
from qlift.options import Range, check_fields

SOURCES = ("hf", "modelscope", "auto")


@dataclass(frozen=True)
class DownloadOptions:
    output: Path | None = field(default=None, metadata={"short": "-o"})
    """Output directory (default: ./NAME)."""
    source: str = field(default="hf", metadata={"choices": SOURCES})
    """Hub to use; auto tries Hugging Face, then ModelScope when the Hub is unreachable."""
    revision: str | None = None
    """Branch, tag or commit (default: main on the Hub, master on ModelScope)."""
    include: tuple[str, ...] = field(default=(), metadata={"metavar": "GLOB"})
    """Only files matching GLOB (path or base name); repeatable. Replaces the defaults."""
    exclude: tuple[str, ...] = field(default=(), metadata={"metavar": "GLOB"})
    """Skip files matching GLOB; repeatable."""
    endpoint: str | None = field(default=None, metadata={"url": True, "metavar": "URL"})
    """Hub URL (a mirror); default HF_ENDPOINT or the SDK's ModelScope endpoint."""
    token_env: str | None = field(default=None, metadata={"metavar": "NAME"})
    """Read the access token from environment variable NAME (default: the client's own login)."""
    max_workers: Annotated[int, Range(ge=1, le=64)] = 8
    """Files fetched in parallel."""
    dry_run: bool = False
    """List files, total size and free disk; download nothing."""
    force: bool = False
    """Replace an existing output directory."""

    def __post_init__(self) -> None:
        check_fields(self)

    def token(self) -> str | None:
        """The access token from --token-env's variable (None: the client's own login); the token itself is
        never kept in the options, so it cannot end up in a result, a manifest or a log."""
        if not self.token_env:
            return None
        token = os.environ.get(self.token_env)
        if not token:
            raise BadInputError(f"environment variable {self.token_env} is not set or empty", field="token_env",
                                hint=f"Export {self.token_env} with your access token, or drop token_env.")
        return token
