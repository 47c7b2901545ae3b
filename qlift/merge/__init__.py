"""Shard-streaming LoRA merge, exact to peft's merge_and_unload."""

from qlift.merge.options import MergeOptions
from qlift.merge.run import MergeResult, merge_model

__all__ = ["MergeOptions", "MergeResult", "merge_model"]
