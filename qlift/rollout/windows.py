"""What a window of each kind needs, decided once from the ``RolloutSpec`` (and read, never re-derived, by the
controller, the analysis and the judge):

- a step's window (``STEP``): a split window, each version answering its own share of users; the canary needs
  ``analysis.min_requests`` requests; it may end early once canary errors are significant; it compares the
  canary with the stable over the same window; ``analysis.intervals_per_step`` passing windows end the step.
- a shadow window (``SHADOW``): both versions answer the same mirrored prompts; it needs ``shadow.min_pairs``
  answered pairs; it runs its whole interval (its pairs trickle in); ``shadow.windows`` passing windows end
  the shadow phase.
- a bake window (``BAKE``): a split window at canary 100%, compared with the stable's figures kept from its last
  window before the switch; ``min_requests`` and an early end as a step's; ``bake`` passing windows end it.

Every kind holds up to ``analysis.max_inconclusive`` windows. Shadow and bake windows are journaled (and their
held evidence carried) under their own step index, ``SHADOW_STEP`` and ``BAKE_STEP``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from qlift.rollout.check_types import WindowKind
from qlift.rollout.spec import AnalysisSpec, RolloutSpec, ShadowSpec
from qlift.rollout.states import State, StepOutcome
from qlift.rollout.webhook import WebhookAction

SHADOW_STEP = -1  # the step index shadow windows are journaled (and their evidence carried) under
BAKE_STEP = -2  # ... and the bake's windows at 100% (``RolloutSpec.bake``)


class WindowRole(StrEnum):
    """Where in a rollout a window runs."""

    STEP = "step"
    SHADOW = "shadow"
    BAKE = "bake"


def min_count(kind: WindowKind, a: AnalysisSpec, shadow: ShadowSpec | None = None) -> int:
    """What the canary must count in a window of ``kind`` before it can pass: requests in a split window,
    answered pairs (``shadow.min_pairs``) in a shadow one."""
    if kind == WindowKind.SHADOW:
        return (shadow or ShadowSpec.model_validate({})).min_pairs
    return a.min_requests


@dataclass(frozen=True)
class WindowPolicy:
    """What a window of one kind needs, and how the analysis (analysis.py) treats it where kinds differ."""

    role: WindowRole
    kind: WindowKind  # what its checks see: a split window or a shadow one
    min_count: int  # canary requests (split) or answered pairs (shadow) before it can pass
    interval_s: float
    early_end: bool  # a window in progress ends early once canary errors are significant
    against: str  # what the canary is compared with, in words
    passes: int  # passing windows that end the step, the shadow phase or the bake
    max_holds: int  # held windows tolerated (max_inconclusive)
    # a passing window spends the held windows before it: the next one gets max_holds holds of its own
    pass_resets_holds: bool = False
    # held windows beyond max_holds do what on_insufficient says whatever held them (else: only too little
    # canary traffic pauses; an unsure check rolls back)
    exhausted_holds_follow_on_insufficient: bool = False
    # the stable's evidence is the kept figures the window came with, never added up with held windows'
    kept_stable: bool = False
    passed_state: State = State.PROGRESSING  # where the rollout goes once ``passes`` windows passed
    next_step_on_pass: bool = True  # ... and whether it moves to the next step's weights
    finish_on_pass: StepOutcome | None = StepOutcome.PASSED  # how the current step ends then, if it does
    webhook_on_pass: WebhookAction = WebhookAction.ADVANCE
    reason_prefix: str = ""  # what a rolled-back or failed-to-measure window's reason starts with
    passed_text: str = "{reason}"  # the reason once it passed: {needed}, {reason}
    pass_text: str = "{reason}"  # a passing window's reason short of that: {done}, {needed}, {reason}

    @property
    def journal_step(self) -> int | None:
        """The step index its windows are journaled under; None: the step's own."""
        return {WindowRole.SHADOW: SHADOW_STEP, WindowRole.BAKE: BAKE_STEP}.get(self.role)


def step_policy(spec: RolloutSpec) -> WindowPolicy:
    a = spec.analysis
    return WindowPolicy(WindowRole.STEP, WindowKind.SPLIT, min_count(WindowKind.SPLIT, a), spec.interval, True,
                        "the stable over the same window", a.intervals_per_step, a.max_inconclusive)


def shadow_policy(spec: RolloutSpec) -> WindowPolicy | None:
    """None without a shadow phase."""
    if spec.shadow is None:
        return None
    a = spec.analysis
    return WindowPolicy(WindowRole.SHADOW, WindowKind.SHADOW, min_count(WindowKind.SHADOW, a, spec.shadow),
                        spec.interval, False, "the stable's answers to the same prompts", spec.shadow.windows,
                        a.max_inconclusive, pass_resets_holds=True, exhausted_holds_follow_on_insufficient=True,
                        next_step_on_pass=False, finish_on_pass=None, reason_prefix="shadow phase: ",
                        passed_text="shadow phase passed ({needed} windows): {reason}")


def bake_policy(spec: RolloutSpec) -> WindowPolicy | None:
    """None without ``--bake``."""
    if not spec.bake:
        return None
    a = spec.analysis
    return WindowPolicy(WindowRole.BAKE, WindowKind.SPLIT, min_count(WindowKind.SPLIT, a), spec.interval, True,
                        "the stable's figures from its last window before the switch", spec.bake, a.max_inconclusive,
                        kept_stable=True, passed_state=State.BAKED, next_step_on_pass=False,
                        finish_on_pass=StepOutcome.PROMOTED, webhook_on_pass=WebhookAction.BAKED,
                        passed_text="bake passed ({needed} window(s) at 100%): {reason}",
                        pass_text="bake window {done}/{needed} passed: {reason}")


@dataclass(frozen=True)
class WindowPolicies:
    """A rollout's window policies: its steps', and its shadow phase's and bake's where it has them."""

    step: WindowPolicy
    shadow: WindowPolicy | None
    bake: WindowPolicy | None

    @classmethod
    def of(cls, spec: RolloutSpec) -> WindowPolicies:
        return cls(step_policy(spec), shadow_policy(spec), bake_policy(spec))
