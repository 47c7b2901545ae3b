"""qlift promote: canary promotion between two served model versions.

Steps of canary weight (10 -> 50 -> 100 by default), an analysis window per step that
compares the canary with the stable (errors, latency, TTFT, and what an LLM gets wrong:
answers cut at max_tokens, rambling, silence), statistical tests before a verdict, a
crash-safe SQLite journal, and three data planes (the qlift router, nginx, Gateway API).
"""

from qlift.rollout.api import abort, default_journal, pause, promote_now, resume, start, status
from qlift.rollout.run import RolloutInputs, run
from qlift.rollout.spec import RolloutSpec, build_spec, read_spec_file

__all__ = ["RolloutInputs", "RolloutSpec", "abort", "build_spec", "default_journal", "pause", "promote_now",
           "read_spec_file", "resume", "run", "start", "status"]
