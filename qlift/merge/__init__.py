"""Shard-streaming LoRA merge, exact to peft's merge_and_unload."""

from qlift.merge.run import MergeResult, merge_model

__all__ = ["MergeResult", "merge_model"]
