"""qlift eval: a candidate model against its baseline on held-out prompts."""

from qlift.eval.run import EvalResult, evaluate, require_pass

__all__ = ["EvalResult", "evaluate", "require_pass"]
