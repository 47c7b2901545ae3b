"""What a check reads and returns: one window of either kind (split or shadow) and one check's verdict on
it. checks.py holds the registry that runs over a ``Window``; pair_checks.py the checks of answer pairs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from qlift.rollout.evidence import VersionEvidence
from qlift.rollout.spec import AnalysisSpec, ShadowSpec

if TYPE_CHECKING:
    from qlift.quality.judge import JudgeResult
    from qlift.rollout.shadow import ShadowEvidence
    from qlift.rollout.stable_reads import StableReads


class CheckStatus(StrEnum):
    """One check's verdict on one window; skipped where the evidence source cannot give its numbers."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    SKIPPED = "skipped"


@dataclass
class CheckResult:
    name: str
    status: CheckStatus
    canary: float | None = None
    stable: float | None = None
    ratio: float | None = None
    limit: float | None = None
    test: str | None = None
    p_value: float | None = None
    detail: str = ""
    examples: list[dict[str, str | None]] = field(default_factory=list)  # answer checks: what a person reads


@dataclass(frozen=True)
class Look:
    """A look at a split window in progress: the share of its interval gone at the previous look and now. The
    answer checks spend part of their level over the looks (``answer_checks.look_level``)."""

    before: float
    now: float


class WindowKind(StrEnum):
    """What a window is: a split one (each version answers its own share of users) or a shadow one (both
    versions answer the same mirrored prompts, pair by pair). A check names the kinds it applies to."""

    SPLIT = "split"
    SHADOW = "shadow"


BOTH = frozenset(WindowKind)


class FedCheck(Protocol):
    """What a window asks of a check (checks.Check) to tell whether it has that check's inputs."""

    @property
    def applies(self) -> frozenset[WindowKind]: ...

    @property
    def reads(self) -> tuple[str, ...]: ...


@dataclass
class Window:
    """What the checks read of one window: each version's evidence; in a shadow window also its pairs and the
    shadow section; and, where a judge model ran, its verdicts (``judge_margin`` set: the judge's check runs)."""

    kind: WindowKind
    canary: VersionEvidence
    stable: VersionEvidence
    min_count: int  # canary requests (answered pairs in a shadow window) before it can pass: windows.min_count
    pairs: ShadowEvidence | None = None
    shadow: ShadowSpec | None = None
    judged: JudgeResult | None = None
    judge_margin: float | None = None
    alpha: float = 0.05  # the window's family-wise level before Bonferroni (run_checks sets it; agreement's test)
    look: Look | None = None  # a peek at a window in progress; None: the window's end
    reads: StableReads | None = None  # both versions' answers read by the stable model (stable_reads.py)

    def feeds(self, check: FedCheck) -> bool:
        """This window has what ``check`` reads: answers on both sides, the judge's verdicts, a shadow's pairs."""
        if self.kind not in check.applies:
            return False
        if check.reads == ("answers",):
            return self.canary.answers is not None and self.stable.answers is not None
        if check.reads == ("judged",):
            return self.judge_margin is not None
        if check.reads == ("reads",):
            return self.reads is not None and self.reads.skipped is None
        return True


Runner = Callable[[Window, AnalysisSpec], CheckResult | None]  # a check's test over one window
