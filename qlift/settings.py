"""Every environment variable qlift reads, in one place."""

from __future__ import annotations

import os
from pathlib import Path


def qlift_home() -> Path:
    """Root for qlift's state: caches, tool environments, run directories."""
    env = os.environ.get("QLIFT_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "qlift"


def cache_dir() -> Path:
    """Converted models and other reusable artifacts (QLIFT_CACHE_DIR overrides)."""
    env = os.environ.get("QLIFT_CACHE_DIR")
    return Path(env).expanduser() if env else qlift_home() / "cache"


def tool_envs_dir() -> Path:
    """Managed tool environments (llm-compressor's, ...), keyed by spec hash, in the cache dir."""
    return cache_dir() / "envs"


def debug_enabled() -> bool:
    return os.environ.get("QLIFT_DEBUG", "").lower() in {"1", "true", "yes"}


def vllm_python() -> str | None:
    """Python interpreter that has vLLM installed, when it is not the current one."""
    return os.environ.get("QLIFT_VLLM_PYTHON") or None


def recipes_dir_override() -> Path | None:
    """Directory of serving recipes (*.yaml) to use instead of the shipped ones (QLIFT_RECIPES_DIR)."""
    env = os.environ.get("QLIFT_RECIPES_DIR")
    return Path(env).expanduser() if env else None


def hf_endpoint() -> str | None:
    """Hugging Face Hub (or mirror) URL for `qlift download` (HF_ENDPOINT, as huggingface_hub reads it).

    ModelScope's endpoint and both hubs' tokens (HF_TOKEN, MODELSCOPE_ENDPOINT,
    MODELSCOPE_API_TOKEN) are read by their client libraries, not by qlift.
    """
    return os.environ.get("HF_ENDPOINT") or None


def eval_cache_dir() -> Path:
    """Cached eval generations (QLIFT_EVAL_CACHE overrides; default CACHE_DIR/eval)."""
    env = os.environ.get("QLIFT_EVAL_CACHE")
    return Path(env).expanduser() if env else cache_dir() / "eval"


def router_token(given: str | None = None) -> str | None:
    """Bearer token of `qlift router`'s admin API: ``given`` (a caller's own), else QLIFT_ROUTER_TOKEN; unset =
    admin API off. Resolved once where a command or a library call enters, then passed to what needs it.

    Stripped of surrounding whitespace (a trailing newline from `$(cat token.txt)` or a file
    read as-is), as the router strips the token a client presents: the two sides always agree.
    """
    return (given or os.environ.get("QLIFT_ROUTER_TOKEN") or "").strip() or None
