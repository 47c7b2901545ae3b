"""Serving: vLLM processes, recipes, memory plans."""

from typing import TYPE_CHECKING

from qlift.lazy import lazy_exports
from qlift.serve.run import ServeHooks, ServeInputs, run, start

if TYPE_CHECKING:
    from qlift.serve.foreground import ServeOutcome
    from qlift.serve.handle import ServeHandle
    from qlift.serve.options import ServeOptions

__all__ = ["ServeHandle", "ServeHooks", "ServeInputs", "ServeOptions", "ServeOutcome", "run", "start"]
_HOME = {"ServeOptions": "options", "ServeOutcome": "foreground", "ServeHandle": "handle"}

# On first use: serve's modules load recipes and hardware probes, which `qlift --help` does not need.
__getattr__ = lazy_exports(__name__, _HOME)
