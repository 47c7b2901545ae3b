"""Downloading model repos from the Hugging Face Hub and ModelScope, pinned and verified."""

from qlift.hub.download import DownloadResult, download
from qlift.hub.lock import LOCK_NAME, Lock, LockedFile, VerifyResult, read_lock, verify_dir
from qlift.hub.options import DownloadOptions

__all__ = ["LOCK_NAME", "DownloadOptions", "DownloadResult", "Lock", "LockedFile", "VerifyResult", "download",
           "read_lock", "verify_dir"]
