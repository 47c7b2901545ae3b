"""The judge: every check of ``checks.CHECKS`` that applies to the window compares the canary with the stable
over one window, a split window (``Evidence``: each version answers its own users) or a shadow one
(``ShadowEvidence``: both answer the same mirrored prompts; its pairs feed the pair checks too). One function,
``judge``, for both.

A check passes, fails or is inconclusive (``skipped`` where the evidence source cannot give
its numbers). The window's verdict, in this order:

- ``fail``: any check failed -> action ``rollback``, at once, below ``min_requests`` too (a
  canary answering garbage is rolled back in its first window once that is significant);
- ``insufficient``: the canary served fewer than ``min_requests`` (a shadow window: fewer than
  ``shadow.min_pairs`` pairs) -> action ``hold``, with ``Decision.sizing`` saying how to size a split
  window (weight x requests/s x interval >= min_requests). Too little traffic is no evidence against
  the canary: the analysis pauses (``AnalysisSpec.on_insufficient``) instead of counting it toward a
  rollback;
- ``inconclusive``: a limit exceeded without significance, or no numbers -> action ``hold``;
- ``pass``: every check passed -> action ``advance``;
- ``error``: a split window whose evidence source failed (``Evidence.error``) holds, measured nothing.

``Decision.action`` keeps the three actions a controller acts on; ``Decision.verdict`` tells
an insufficient hold from an inconclusive one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from qlift.rollout.check_types import Look
from qlift.rollout.checks import (  # noqa: F401  (re-exported: the controller and tests import them here)
    CHECKS,
    CheckResult,
    CheckStatus,
    Window,
    WindowKind,
    check_alpha,
    check_completion_tokens,
    check_error_rate,
    quantile_only_requests,
    tested_checks,
    window_spec,
)
from qlift.rollout.checks import run_checks as _run
from qlift.rollout.evidence import Evidence
from qlift.rollout.shadow import ShadowEvidence
from qlift.rollout.spec import AnalysisSpec, ShadowSpec
from qlift.rollout.traffic import TrafficCause, TrafficCounts, explain
from qlift.rollout.windows import min_count


class Action(StrEnum):
    """What a judged window asks of the rollout (the analysis, analysis.py, decides what it does)."""

    ADVANCE = "advance"
    HOLD = "hold"
    ROLLBACK = "rollback"


class Verdict(StrEnum):
    """A window's measurement, as Argo's assessMetricStatus phases: a failed check, too few canary requests, a
    check unsure, every check passed, or no measurement at all (the evidence source failed: an outage, not a
    quiet canary)."""

    PASS = CheckStatus.PASS
    FAIL = CheckStatus.FAIL
    INCONCLUSIVE = CheckStatus.INCONCLUSIVE
    INSUFFICIENT = "insufficient"
    ERROR = "error"


@dataclass
class Sizing:
    """Why a window had too little canary traffic, and what would be enough."""

    canary_requests: int
    min_requests: int
    window_s: float
    requests_per_s: float  # both versions together over the window
    canary_share: float  # the planned weight (0-1) where the evidence carries it, else the observed share
    # the window that would see min_requests at this rate and share; None where a longer one is not the fix
    needed_interval_s: float | None
    cause: TrafficCause  # why, from the router's counts (traffic.explain, the one sizing rule)

    def advice(self) -> str:
        return self.cause.text


@dataclass
class Decision:
    action: Action
    reason: str
    checks: list[CheckResult] = field(default_factory=list)
    verdict: Verdict = Verdict.INCONCLUSIVE
    sizing: Sizing | None = None

    @property
    def p_values(self) -> dict[str, float]:
        return {c.name: c.p_value for c in self.checks if c.p_value is not None}

    @property
    def insufficient(self) -> bool:
        return self.verdict == Verdict.INSUFFICIENT


TESTED_CHECKS = tested_checks()


def window_of(ev: Evidence | ShadowEvidence, a: AnalysisSpec, shadow: ShadowSpec | None = None) -> Window:
    """The window the checks read, with what it must count before it can pass (``windows.min_count``: answered
    pairs in a shadow window, canary requests in a split one)."""
    if isinstance(ev, ShadowEvidence):
        spec = shadow or ShadowSpec.model_validate({})
        margin = spec.max_judge_loss_margin if spec.judge is not None else None
        return Window(WindowKind.SHADOW, ev.side("shadow"), ev.side("primary"), min_count(WindowKind.SHADOW, a, spec),
                      ev, spec, ev.judged, margin, reads=ev.reads)
    margin = None if ev.judged is None else ev.judge_margin  # the judge model's check joins the family
    return Window(WindowKind.SPLIT, ev.canary, ev.stable, min_count(WindowKind.SPLIT, a), judged=ev.judged,
                  judge_margin=margin, reads=ev.reads)


def run_checks(ev: Evidence, a: AnalysisSpec) -> list[CheckResult]:
    return _run(window_of(ev, a), a)


def early_failures(ev: Evidence, a: AnalysisSpec, look: Look | None = None) -> list[CheckResult]:
    """Failures of the checks that may end a window before its end (errors, garbage, empty answers, and the answer
    checks at the level ``look`` spends): what a controller peeking at a window in progress acts on."""
    w = Window(WindowKind.SPLIT, ev.canary, ev.stable, min_count(WindowKind.SPLIT, a), look=look)
    return [c for c in _run(w, a, early_only=True) if c.status == CheckStatus.FAIL]


def sizing(ev: Evidence, a: AnalysisSpec) -> Sizing:
    window_s = max(ev.ended_at - ev.started_at, 1e-9)
    total = ev.canary.requests + ev.stable.requests
    observed = ev.canary.requests / total if total else 0.0
    share = ev.weight / 100 if ev.weight is not None else observed
    counts = TrafficCounts.of(ev, share=share, window_s=window_s, min_requests=a.min_requests)
    cause = explain(counts)
    return Sizing(ev.canary.requests, a.min_requests, window_s, counts.requests_per_s, share, cause.needed_interval_s,
                  cause)


def judge(ev: Evidence | ShadowEvidence, a: AnalysisSpec, shadow: ShadowSpec | None = None) -> Decision:
    """One window of either kind under ``a`` (and ``shadow``, the shadow section, for a shadow window)."""
    w = window_of(ev, a, shadow)
    d = _decide(ev, w, a, _run(w, a))
    if ev.error is not None and d.action == Action.HOLD:
        d.verdict = Verdict.ERROR  # nothing measured: no verdict on the canary either way
    return d


def _decide(ev: Evidence | ShadowEvidence, w: Window, a: AnalysisSpec, checks: list[CheckResult]) -> Decision:
    paired = isinstance(ev, ShadowEvidence)
    failed = [c for c in checks if c.status == CheckStatus.FAIL]
    if failed:
        reason = "; ".join(f"{c.name}: {c.detail}" for c in failed)
        return Decision(Action.ROLLBACK, ("shadow: " if paired else "") + reason, checks, Verdict.FAIL)
    if w.canary.requests < w.min_count:
        if paired:
            return Decision(Action.HOLD, f"insufficient: {w.canary.requests} shadow pairs < min_pairs "
                                         f"{w.min_count} (raise the shadow percent or the interval)", checks,
                            Verdict.INSUFFICIENT)
        assert isinstance(ev, Evidence)
        size = sizing(ev, a)
        return Decision(Action.HOLD, f"insufficient: canary served {ev.canary.requests} requests < min_requests "
                                     f"{w.min_count} ({size.advice()})", checks, Verdict.INSUFFICIENT, size)
    unsure = [c for c in checks if c.status == CheckStatus.INCONCLUSIVE]
    if unsure:
        return Decision(Action.HOLD, ("shadow inconclusive: " if paired else "inconclusive: ")
                        + "; ".join(f"{c.name}: {c.detail}" for c in unsure), checks)
    if paired:
        return Decision(Action.ADVANCE, f"shadow: every check passed over {w.canary.requests} pairs", checks,
                        Verdict.PASS)
    if all(c.status == CheckStatus.SKIPPED for c in checks if c.name != "canary_requests"):
        return Decision(Action.HOLD, "inconclusive: the evidence source gave no numbers to judge", checks)
    return Decision(Action.ADVANCE, "every check passed", checks, Verdict.PASS)
