"""Model directories: reading configs, safetensors headers, tokenizers and lineage."""

from qlift.models.modeldir import ModelDir, TensorInfo

__all__ = ["ModelDir", "TensorInfo"]
