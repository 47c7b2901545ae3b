"""The promote stage's entry point: ``run(RolloutInputs, RolloutSpec) -> Rollout``.

``RolloutSpec`` is the stage's options (what ``qlift promote start`` builds from its flags or ``-f``); the
inputs are the journal the controller keeps its state in. It runs in the foreground until the rollout is final.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qlift.rollout.api import start
from qlift.rollout.journal import Rollout
from qlift.rollout.spec import RolloutSpec
from qlift.settings import router_token


@dataclass(frozen=True)
class RolloutInputs:
    """The journal (None: the default one); ``new`` starts a new rollout rather than resuming an active one;
    ``allow_stable_down`` starts one even though the data plane reports the stable down; ``canary_adapter``
    (NAME, DIR): load that LoRA adapter into the stable's server as the canary first (api.start_with_adapter);
    ``router_token``: the router's admin token (None: QLIFT_ROUTER_TOKEN as the environment has it), never
    journaled, printed or logged."""

    journal: Path | None = None
    new: bool = False
    allow_stable_down: bool = False
    force: bool = False  # start although the live weights or shadow are not the starting state (preflight.py)
    allow_small_windows: bool = False  # start although the windows cannot reach their minimum at today's traffic
    canary_adapter: tuple[str, Path] | None = None
    spec_file: Path | None = None  # the -f file the spec was read from, for hints that print a start command
    router_token: str | None = field(default=None, repr=False, metadata={"json": False})


def run(inputs: RolloutInputs, options: RolloutSpec) -> Rollout:
    """Run the rollout ``options`` describe until it is final (``api.start``); the journal's last record of it.
    The admin token is resolved here once (``inputs.router_token``, else QLIFT_ROUTER_TOKEN) and handed to the
    plane and the evidence it builds; the environment is never edited."""
    token = router_token(inputs.router_token)
    if inputs.canary_adapter is not None:
        from qlift.rollout.api import start_with_adapter

        name, adapter = inputs.canary_adapter
        return start_with_adapter(options, inputs.journal, name, adapter, new=inputs.new,
                                  allow_stable_down=inputs.allow_stable_down, force=inputs.force,
                                  spec_file=inputs.spec_file, router_token=token,
                                  allow_small_windows=inputs.allow_small_windows)[0]
    return start(options, inputs.journal, new=inputs.new, allow_stable_down=inputs.allow_stable_down,
                 force=inputs.force, spec_file=inputs.spec_file, router_token=token,
                 allow_small_windows=inputs.allow_small_windows)
