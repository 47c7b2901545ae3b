"""Downloading model repos from the Hugging Face Hub and ModelScope, pinned and verified."""

from qlift.hub.download import DownloadResult, download
from qlift.hub.lock import LOCK_NAME, Lock, LockedFile, VerifyResult, read_lock, verify_dir
from qlift.hub.options import DownloadOptions
from qlift.hub.run import DownloadInputs, run

__all__ = ["LOCK_NAME", "DownloadInputs", "DownloadOptions", "DownloadResult", "Lock", "LockedFile", "VerifyResult",
           "download", "read_lock", "run", "verify_dir"]
