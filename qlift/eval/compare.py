"""Aggregates per slice, paired bootstrap confidence intervals, win/tie/loss counts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qlift.eval.metrics import METRICS, Score

TIE_TOLERANCE = 1e-9


@dataclass
class MetricSummary:
    """One metric on one slice: both models, their difference and its 95% CI."""

    metric: str
    n: int
    candidate: float | None
    baseline: float | None = None
    diff: float | None = None  # candidate - baseline
    ci_low: float | None = None
    ci_high: float | None = None
    wins: int | None = None  # examples where the candidate is better
    ties: int | None = None
    losses: int | None = None
    higher_is_better: bool | None = None

    @property
    def ci_contains_zero(self) -> bool | None:
        if self.ci_low is None or self.ci_high is None:
            return None
        return self.ci_low <= 0.0 <= self.ci_high


def _aggregate(metric: str, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Aggregate over the last axis: a mean, or token-level perplexity for ppl."""
    if metric == "ppl":
        return np.exp(num.sum(axis=-1) / den.sum(axis=-1))
    return num.mean(axis=-1)


def summarize(
    metric: str,
    cand: list[Score | None],
    base: list[Score | None] | None,
    *,
    resamples: int,
    seed: int,
) -> MetricSummary:
    """Summary over the examples where the metric has a value for every model."""
    keep = [i for i, s in enumerate(cand) if s is not None and (base is None or base[i] is not None)]
    hib = METRICS[metric].higher_is_better
    if not keep:
        return MetricSummary(metric, 0, None, higher_is_better=hib)
    c_num = np.array([cand[i].num for i in keep])  # type: ignore[union-attr]
    c_den = np.array([cand[i].den for i in keep])  # type: ignore[union-attr]
    out = MetricSummary(metric, len(keep), finite(float(_aggregate(metric, c_num, c_den))), higher_is_better=hib)
    if base is None:
        return out
    b_num = np.array([base[i].num for i in keep])  # type: ignore[union-attr]
    b_den = np.array([base[i].den for i in keep])  # type: ignore[union-attr]
    out.baseline = finite(float(_aggregate(metric, b_num, b_den)))
    if out.candidate is not None and out.baseline is not None:
        out.diff = out.candidate - out.baseline
    # Paired: each resample draws the same examples for both models.
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(keep), size=(resamples, len(keep)))
    diffs = _aggregate(metric, c_num[idx], c_den[idx]) - _aggregate(metric, b_num[idx], b_den[idx])
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    out.ci_low, out.ci_high = finite(float(lo)), finite(float(hi))
    if hib is not None:
        d = np.array([cand[i].value - base[i].value for i in keep])  # type: ignore[union-attr]
        better = d > TIE_TOLERANCE if hib else d < -TIE_TOLERANCE
        worse = d < -TIE_TOLERANCE if hib else d > TIE_TOLERANCE
        out.wins, out.losses = int(better.sum()), int(worse.sum())
        out.ties = len(keep) - out.wins - out.losses
    return out


def finite(x: float | None) -> float | None:
    """NaN and infinity (a reference the model gave zero probability) become None: JSON has neither."""
    return x if x is not None and math.isfinite(x) else None
