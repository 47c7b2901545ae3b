"""The judge: every check of ``checks.CHECKS`` compares the canary with the stable over one window.

A check passes, fails or is inconclusive (``skipped`` where the evidence source cannot give
its numbers). The window's verdict, in this order:

- ``fail``: any check failed -> action ``rollback``, at once, below ``min_requests`` too (a
  canary answering garbage is rolled back in its first window once that is significant);
- ``insufficient``: the canary served fewer than ``min_requests`` -> action ``hold``, with
  ``Decision.sizing`` saying how to size the window (weight x requests/s x interval >=
  min_requests). Too little traffic is no evidence against the canary: the analysis pauses
  (``AnalysisSpec.on_insufficient``) instead of counting it toward a rollback;
- ``inconclusive``: a limit exceeded without significance, or no numbers -> action ``hold``;
- ``pass``: every check passed -> action ``advance``.

``Decision.action`` keeps the three actions a controller acts on; ``Decision.verdict`` tells
an insufficient hold from an inconclusive one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from qlift.rollout.checks import (  # noqa: F401  (re-exported: the controller and tests import them here)
    CHECKS,
    CheckResult,
    CheckStatus,
    check_alpha,
    check_completion_tokens,
    check_error_rate,
    quantile_only_requests,
    tested_checks,
    window_spec,
)
from qlift.rollout.checks import run_checks as _run
from qlift.rollout.evidence import Evidence
from qlift.rollout.spec import AnalysisSpec
from qlift.rollout.stats import binomial_greater

if TYPE_CHECKING:
    from qlift.quality.judge import JudgeResult



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
    needed_interval_s: float | None  # the window that would see min_requests at this rate and share

    def advice(self) -> str:
        expected = self.canary_share * self.requests_per_s * self.window_s
        text = (f"canary {self.canary_share:.0%} x {self.requests_per_s:.3g} req/s x {self.window_s:.0f}s = "
                f"{expected:.1f} requests < min_requests {self.min_requests}")
        if self.needed_interval_s is not None:
            text += f"; needs --interval >= {self.needed_interval_s:.0f}s at this traffic"
        return text + ", more traffic, or a lower --min-requests"


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


def run_checks(ev: Evidence, a: AnalysisSpec) -> list[CheckResult]:
    return _run(ev.canary, ev.stable, a)


def early_failures(ev: Evidence, a: AnalysisSpec) -> list[CheckResult]:
    """Failures of the checks that may end a window before its end (errors, garbage, empty answers):
    what a controller peeking at a window in progress acts on."""
    return [c for c in _run(ev.canary, ev.stable, a, early_only=True) if c.status == CheckStatus.FAIL]


def sizing(ev: Evidence, a: AnalysisSpec) -> Sizing:
    window_s = max(ev.ended_at - ev.started_at, 1e-9)
    total = ev.canary.requests + ev.stable.requests
    rps = total / window_s
    observed = ev.canary.requests / total if total else 0.0
    share = ev.weight / 100 if ev.weight is not None else observed
    needed = a.min_requests / (share * rps) if share > 0 and rps > 0 else None
    return Sizing(ev.canary.requests, a.min_requests, window_s, rps, share, needed)


def check_judge_model(j: JudgeResult | None, margin: float, a: AnalysisSpec) -> CheckResult:
    """The judge model prefers the stable's answer by more than ``margin`` of the judged pairs, and a one-sided
    sign test over the pairs it did not call a tie agrees. No verdicts: inconclusive, never a failure."""
    r = CheckResult("judge", CheckStatus.INCONCLUSIVE, limit=margin)
    if j is None or not j.judged:
        note = "; ".join(j.notes) if j is not None and j.notes else "no verdicts"
        r.detail = f"the judge gave no verdicts ({note}): inconclusive, never a failure"
        return r
    win, loss = j.share("wins") or 0.0, j.share("losses") or 0.0
    r.canary, r.stable = win, loss
    ci = j.interval("losses")
    described = (f"judge {j.model}: canary better in {j.wins}, tie {j.ties} ({j.swapped_disagreed} by swapped order), "
                 f"stable better in {j.losses} of {j.judged} pairs (loss share {loss:.2f}, 95% CI "
                 f"{ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
    if loss - win <= margin:
        r.status, r.detail = CheckStatus.PASS, described + f"; loss - win {loss - win:.2f} <= {margin}"
        return r
    t = binomial_greater(j.losses, j.wins + j.losses, 0.5)
    r.test, r.p_value = "sign", t.p_value
    r.status = CheckStatus.FAIL if t.p_value < check_alpha(a) else CheckStatus.INCONCLUSIVE
    r.detail = described + f"; loss - win {loss - win:.2f} > {margin}; sign test " \
                           f"p={t.p_value:.3g}" + ("" if r.status == CheckStatus.FAIL else " (not significant)")
    return r


def judge(ev: Evidence, a: AnalysisSpec) -> Decision:
    d = _judge(ev, a)
    if ev.error is not None and d.action == Action.HOLD:  # nothing measured: no verdict on the canary either way
        d.verdict = Verdict.ERROR
    return d


def _judge(ev: Evidence, a: AnalysisSpec) -> Decision:
    if ev.judged is None:
        checks = run_checks(ev, a)
    else:  # the judge model's check joins the window's family (Bonferroni)
        checks = _run(ev.canary, ev.stable, a, extra=1)
        checks.append(check_judge_model(ev.judged, ev.judge_margin, window_spec(ev.canary, ev.stable, a, extra=1)))
    failed = [c for c in checks if c.status == CheckStatus.FAIL]
    if failed:
        return Decision(Action.ROLLBACK, "; ".join(f"{c.name}: {c.detail}" for c in failed), checks, Verdict.FAIL)
    if ev.canary.requests < a.min_requests:
        size = sizing(ev, a)
        return Decision(Action.HOLD, f"insufficient: canary served {ev.canary.requests} requests < min_requests "
                                     f"{a.min_requests} ({size.advice()})", checks, Verdict.INSUFFICIENT, size)
    unsure = [c for c in checks if c.status == CheckStatus.INCONCLUSIVE]
    if unsure:
        return Decision(Action.HOLD, "inconclusive: " + "; ".join(f"{c.name}: {c.detail}" for c in unsure), checks)
    if all(c.status == CheckStatus.SKIPPED for c in checks if c.name != "canary_requests"):
        return Decision(Action.HOLD, "inconclusive: the evidence source gave no numbers to judge", checks)
    return Decision(Action.ADVANCE, "every check passed", checks, Verdict.PASS)
