"""qlift eval: a candidate model against its baseline on held-out prompts."""

from qlift.eval.options import EvalOptions
from qlift.eval.run import EvalResult, evaluate, require_pass

__all__ = ["EvalOptions", "EvalResult", "evaluate", "require_pass"]
