"""qlift eval: a candidate model against its baseline on held-out prompts."""

from qlift.eval.options import EvalOptions
from qlift.eval.run import EvalInputs, EvalResult, evaluate, require_pass, run

__all__ = ["EvalInputs", "EvalOptions", "EvalResult", "evaluate", "require_pass", "run"]
