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
