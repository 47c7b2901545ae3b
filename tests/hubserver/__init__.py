"""A Hugging Face Hub + ModelScope compatible server for tests (real protocols, real clients)."""

from hubserver.server import Fault, HubServer, git_blob_id

__all__ = ["Fault", "HubServer", "git_blob_id"]
