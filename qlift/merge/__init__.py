"""Shard-streaming LoRA merge, exact to peft's merge_and_unload."""

from qlift.merge.options import MergeOptions
from qlift.merge.run import MergeInputs, MergeResult, merge_model, run

__all__ = ["MergeInputs", "MergeOptions", "MergeResult", "merge_model", "run"]
