"""Model directories: reading configs, safetensors headers, tokenizers and lineage; ``ModelRef``,
what a model version is (base, adapters, content hash)."""

from qlift.models.modeldir import ModelDir, TensorInfo
from qlift.models.ref import AdapterRef, ModelRef

__all__ = ["AdapterRef", "ModelDir", "ModelRef", "TensorInfo"]
