"""The promote stage's entry point: ``run(RolloutInputs, RolloutSpec) -> Rollout``.

``RolloutSpec`` is the stage's options (what ``qlift promote start`` builds from its flags or ``-f``); the
inputs are the journal the controller keeps its state in. It runs in the foreground until the rollout is final.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qlift.rollout.api import start
from qlift.rollout.journal import Rollout
from qlift.rollout.spec import RolloutSpec


@dataclass(frozen=True)
class RolloutInputs:
    """The journal (None: the default one); ``new`` starts a new rollout rather than resuming an active one."""

    journal: Path | None = None
    new: bool = False


def run(inputs: RolloutInputs, options: RolloutSpec) -> Rollout:
    """Run the rollout ``options`` describe until it is final (``api.start``); the journal's last record of it."""
    return start(options, inputs.journal, new=inputs.new)
