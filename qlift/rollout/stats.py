"""The statistics behind the judge, in plain Python (no scipy): one-sided tests that ask
"is the canary worse than the stable?", so a small step is not judged on noise.

Error and share checks compare two proportions (Fisher's exact test when a cell is small,
else the pooled two-proportion z-test); latency, TTFT and token counts compare samples with
the Mann-Whitney U test (normal approximation with tie and continuity corrections), as
Netflix's Kayenta does; paired samples (a shadow window's) with the Wilcoxon signed-rank test.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TestResult:
    test: str  # "fisher", "z", "binomial", "mann-whitney", "wilcoxon", "mcnemar"
    p_value: float


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_greater(x1: int, n1: int, x2: int, n2: int) -> float:
    """One-sided Fisher exact p-value for H1: rate1 > rate2 (P(X >= x1) under the hypergeometric)."""
    total, hits = n1 + n2, x1 + x2
    if n1 == 0 or total == 0:
        return 1.0
    denom = _log_comb(total, n1)
    top = min(n1, hits)
    p = sum(math.exp(_log_comb(hits, k) + _log_comb(total - hits, n1 - k) - denom) for k in range(x1, top + 1))
    return min(1.0, p)


def two_proportion_greater(x1: int, n1: int, x2: int, n2: int) -> float:
    """One-sided pooled two-proportion z-test p-value for H1: rate1 > rate2."""
    if n1 == 0 or n2 == 0:
        return 1.0
    pooled = (x1 + x2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return 1.0
    return normal_sf((x1 / n1 - x2 / n2) / se)


def proportion_greater(x1: int, n1: int, x2: int, n2: int) -> TestResult:
    """Fisher when any expected cell count is below 5 (the z-test's rule of thumb), else z."""
    total = n1 + n2
    if total == 0:
        return TestResult("fisher", 1.0)
    hits = x1 + x2
    expected = [n * h / total for n in (n1, n2) for h in (hits, total - hits)]
    if min(expected) < 5:
        return TestResult("fisher", fisher_greater(x1, n1, x2, n2))
    return TestResult("z", two_proportion_greater(x1, n1, x2, n2))


def binomial_greater(x: int, n: int, rate: float) -> TestResult:
    """Exact one-sided binomial p-value P(X >= x) for H0: the true rate is ``rate``."""
    if n == 0 or x == 0:
        return TestResult("binomial", 1.0)
    if rate <= 0:
        return TestResult("binomial", 0.0)
    if rate >= 1:
        return TestResult("binomial", 1.0)
    log_p, log_q = math.log(rate), math.log1p(-rate)
    p = sum(math.exp(_log_comb(n, k) + k * log_p + (n - k) * log_q) for k in range(x, n + 1))
    return TestResult("binomial", min(1.0, p))


def _tied_runs(ordered: Sequence[float]) -> Iterator[tuple[int, int]]:
    """(first, last) index of each run of equal values in sorted ``ordered``: the ranks a run shares."""
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[i]:
            j += 1
        yield i, j
        i = j + 1


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> TestResult:
    """One-sided Mann-Whitney U p-value for H1: values of ``x`` tend to be larger than ``y``'s."""
    nx, ny = len(x), len(y)
    if nx == 0 or ny == 0:
        return TestResult("mann-whitney", 1.0)
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    n = nx + ny
    rank_sum_x = 0.0
    tie_term = 0.0
    for i, j in _tied_runs([v for v, _ in pooled]):
        avg_rank = (i + j) / 2 + 1
        t = j - i + 1
        tie_term += t**3 - t
        rank_sum_x += avg_rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
    u = rank_sum_x - nx * (nx + 1) / 2
    mean = nx * ny / 2
    var = nx * ny / 12 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return TestResult("mann-whitney", 1.0)
    return TestResult("mann-whitney", normal_sf((u - mean - 0.5) / math.sqrt(var)))


EXACT_UP_TO = 25  # differences (non-zero) up to which the signed-rank p-value is exact


def wilcoxon_greater(diffs: Sequence[float]) -> TestResult:
    """One-sided Wilcoxon signed-rank p-value for H1: the differences tend to be positive. Zeros are dropped, tied
    magnitudes share their mean rank; exact (every sign pattern, given the ranks) up to EXACT_UP_TO differences,
    else the normal approximation with tie and continuity corrections."""
    d = [x for x in diffs if x != 0]
    n = len(d)
    if n == 0:
        return TestResult("wilcoxon", 1.0)
    order = sorted(range(n), key=lambda i: abs(d[i]))
    doubled = [0] * n  # twice each rank: tied ranks are halves
    ties = 0.0
    for i, j in _tied_runs([abs(d[k]) for k in order]):
        for k in range(i, j + 1):
            doubled[order[k]] = i + j + 2
        t = j - i + 1
        ties += t**3 - t
    w = sum(r for r, x in zip(doubled, d, strict=True) if x > 0)  # doubled W+
    if n <= EXACT_UP_TO:
        counts = [1] + [0] * sum(doubled)  # sign patterns by their doubled W+
        for r in doubled:
            for s in range(len(counts) - 1, r - 1, -1):
                counts[s] += counts[s - r]
        return TestResult("wilcoxon", sum(counts[w:]) / 2**n)
    mu = n * (n + 1) / 4
    var = n * (n + 1) * (2 * n + 1) / 24 - ties / 48
    return TestResult("wilcoxon", normal_sf((w / 2 - mu - 0.5) / math.sqrt(var)) if var > 0 else 1.0)


def quantile(samples: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile (numpy's default method); None for no samples."""
    if not samples:
        return None
    s = sorted(samples)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def mean(samples: Sequence[float]) -> float | None:
    return sum(samples) / len(samples) if samples else None


def mcnemar_greater(worse: int, better: int) -> TestResult:
    """Exact one-sided McNemar test on paired flags: of the pairs where the two versions differ, ``worse``
    flag only the canary's answer and ``better`` only the stable's; H1: the canary's side is flagged more."""
    return TestResult("mcnemar", binomial_greater(worse, worse + better, 0.5).p_value)
