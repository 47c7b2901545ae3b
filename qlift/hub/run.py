"""The download stage's entry point: ``run(DownloadInputs, DownloadOptions) -> DownloadResult``."""

from __future__ import annotations

from dataclasses import dataclass

from qlift.hub.download import DownloadResult, download
from qlift.hub.options import DownloadOptions


@dataclass(frozen=True)
class DownloadInputs:
    """What a download consumes: the repo id (``org/name``). Where it goes is ``DownloadOptions.output``."""

    repo: str


def run(inputs: DownloadInputs, options: DownloadOptions) -> DownloadResult:
    """Download ``inputs.repo`` pinned to one commit, every file verified, as ``options`` say."""
    return download(inputs.repo, options)
