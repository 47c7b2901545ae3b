"""The judge: every check compares the canary with the stable over one window.

A check passes, fails or is inconclusive. The window's decision: roll back at once when
any check fails; hold when any is inconclusive (too little canary traffic, or a limit
exceeded without statistical significance); advance only when every check passes.
A check whose numbers the evidence source cannot give is ``skipped`` (documented per source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.spec import AnalysisSpec
from qlift.rollout.stats import TestResult, binomial_greater, mann_whitney_greater, proportion_greater

Status = Literal["pass", "fail", "inconclusive", "skipped"]
Action = Literal["advance", "hold", "rollback"]


@dataclass
class CheckResult:
    name: str
    status: Status
    canary: float | None = None
    stable: float | None = None
    ratio: float | None = None
    limit: float | None = None
    test: str | None = None
    p_value: float | None = None
    detail: str = ""


@dataclass
class Decision:
    action: Action
    reason: str
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def p_values(self) -> dict[str, float]:
        return {c.name: c.p_value for c in self.checks if c.p_value is not None}


TESTED_CHECKS = 6  # error_rate, latency, ttft, finish_length, completion_tokens, empty_completions


def check_alpha(a: AnalysisSpec) -> float:
    """Per-check significance: ``alpha`` is the family-wise level of one window (Bonferroni over the
    tested checks), so six tests a window do not turn noise into a rollback one time in twenty."""
    return a.alpha / TESTED_CHECKS


def quantile_only_requests(a: AnalysisSpec) -> int:
    """Canary requests before a ratio alone (no samples for a test: Prometheus) may fail a check."""
    return max(a.min_requests, 4 * a.min_samples)


def _ratio(canary: float | None, stable: float | None) -> float | None:
    if canary is None or stable is None:
        return None
    if stable == 0:
        return 1.0 if canary == 0 else math.inf
    return canary / stable


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def check_error_rate(c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult:
    r = CheckResult("error_rate", "inconclusive", c.error_rate, s.error_rate, limit=a.max_error_rate)
    if c.errors is None:
        r.status, r.detail = "skipped", "the evidence source does not count errors"
        return r
    rate = c.error_rate or 0.0
    if rate <= a.max_error_rate:
        r.status, r.detail = "pass", f"canary error rate {rate:.3g} <= {a.max_error_rate}"
        return r
    # Above the limit: is the canary worse than the stable, or is something shared failing?
    if s.errors is not None and s.requests >= a.min_samples:
        t = proportion_greater(c.errors, c.requests, s.errors, s.requests)
    else:
        t = binomial_greater(c.errors, c.requests, a.max_error_rate)
    r.test, r.p_value = t.test, t.p_value
    significant = t.p_value < check_alpha(a)
    r.status = "fail" if significant else "inconclusive"
    r.detail = (f"canary error rate {rate:.3g} ({c.errors}/{c.requests}) > {a.max_error_rate}, stable "
                f"{_fmt(s.error_rate)}; {t.test} p={t.p_value:.3g}" + ("" if significant else " (not significant)"))
    return r


def _samples_test(x: list[float], y: list[float], a: AnalysisSpec, *, larger: bool) -> TestResult | None:
    if len(x) < a.min_samples or len(y) < a.min_samples:
        return None
    return mann_whitney_greater(x, y) if larger else mann_whitney_greater(y, x)


def check_latency(name: str, c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult:
    """``latency`` compares e2e seconds per completion token when both versions have enough such
    samples (verbosity is the completion_tokens check's business), else e2e seconds; ``ttft`` as is."""
    limit, tolerance, kind = a.max_ttft_ratio, a.min_latency_increase_s, name
    if name == "latency":
        limit = a.max_latency_ratio
        if c.token_latency_s and s.token_latency_s:
            kind, tolerance = "token_latency", a.min_token_latency_increase_s
    q = a.latency_quantile
    cv, sv = c.latency_quantile(kind, q), s.latency_quantile(kind, q)
    r = CheckResult(name, "inconclusive", cv, sv, _ratio(cv, sv), limit)
    if cv is None or sv is None:
        r.status = "skipped" if not (c.latency_s or c.ttft_s or c.quantiles) else "inconclusive"
        r.detail = f"no {kind} numbers for " + ("the canary" if cv is None else "the stable")
        return r
    label = f"{kind} p{round(q * 100)}"
    assert r.ratio is not None
    if r.ratio <= limit or cv - sv <= tolerance:
        r.status = "pass"
        r.detail = f"{label} canary {cv:.3g}s / stable {sv:.3g}s = {r.ratio:.3g} " + (
            f"<= {limit}" if r.ratio <= limit else f"(within {tolerance}s)")
        return r
    samples = {"latency": (c.latency_s, s.latency_s), "ttft": (c.ttft_s, s.ttft_s),
               "token_latency": (c.token_latency_s, s.token_latency_s)}[kind]
    detail = f"{label} canary {cv:.3g}s / stable {sv:.3g}s = {r.ratio:.3g} > {limit}"
    return _rank_verdict(r, detail, samples[0], samples[1], c, a, larger=True)


def _rank_verdict(r: CheckResult, detail: str, canary: list[float], stable: list[float], c: VersionEvidence,
                  a: AnalysisSpec, *, larger: bool) -> CheckResult:
    """A ratio past its limit fails only where a Mann-Whitney U test on the samples agrees."""
    t = _samples_test(canary, stable, a, larger=larger)
    if t is None and (canary or stable):
        r.detail = detail + f" (fewer than {a.min_samples} samples a version for a rank test yet)"
        return r
    if t is None:  # a quantile-only source (Prometheus): the ratio decides once there is traffic
        enough = c.requests >= quantile_only_requests(a)
        r.status = "fail" if enough else "inconclusive"
        r.detail = detail + (" (no samples for a rank test)" if enough else " (too few requests yet)")
        return r
    r.test, r.p_value = t.test, t.p_value
    r.status = "fail" if t.p_value < check_alpha(a) else "inconclusive"
    r.detail = f"{detail}; mann-whitney p={t.p_value:.3g}" + ("" if r.status == "fail" else " (not significant)")
    return r


def _share_check(name: str, cx: int | None, cn: int | None, sx: int | None, sn: int | None,
                 limit: float, a: AnalysisSpec) -> CheckResult:
    cshare = cx / cn if cx is not None and cn else None
    sshare = sx / sn if sx is not None and sn else None
    r = CheckResult(name, "inconclusive", cshare, sshare, _ratio(cshare, sshare), limit)
    if cn is None or cx is None:
        r.status, r.detail = "skipped", f"the evidence source has no {name} counts"
        return r
    if cshare is None or sshare is None or sn is None or sx is None:
        r.detail = "no answers to compare yet"
        return r
    assert r.ratio is not None
    worse = r.ratio > limit and cshare - sshare >= a.min_share_increase
    if not worse:
        r.status, r.detail = "pass", f"canary {cshare:.3g} vs stable {sshare:.3g} (ratio {r.ratio:.3g} <= {limit} " \
                                     f"or less than {a.min_share_increase} higher)"
        return r
    t = proportion_greater(cx, cn, sx, sn)
    r.test, r.p_value = t.test, t.p_value
    r.status = "fail" if t.p_value < check_alpha(a) else "inconclusive"
    r.detail = (f"canary {cshare:.3g} ({cx}/{cn}) vs stable {sshare:.3g} ({sx}/{sn}), ratio {r.ratio:.3g} > {limit}; "
                f"{t.test} p={t.p_value:.3g}" + ("" if r.status == "fail" else " (not significant)"))
    return r


def check_completion_tokens(c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult:
    cv, sv = c.mean_completion_tokens, s.mean_completion_tokens
    r = CheckResult("completion_tokens", "inconclusive", cv, sv, _ratio(cv, sv), a.max_tokens_ratio)
    if c.completions is None:
        r.status, r.detail = "skipped", "the evidence source has no completion token counts"
        return r
    if cv is None or sv is None or r.ratio is None:
        r.detail = "no answers to compare yet"
        return r
    if a.min_tokens_ratio <= r.ratio <= a.max_tokens_ratio:
        r.status = "pass"
        r.detail = f"mean completion tokens canary {cv:.3g} / stable {sv:.3g} = {r.ratio:.3g} " \
                   f"within [{a.min_tokens_ratio}, {a.max_tokens_ratio}]"
        return r
    longer = r.ratio > a.max_tokens_ratio
    r.limit = a.max_tokens_ratio if longer else a.min_tokens_ratio
    what = "rambles" if longer else "goes quiet"
    detail = f"canary {what}: mean completion tokens {cv:.3g} vs {sv:.3g} (ratio {r.ratio:.3g})"
    return _rank_verdict(r, detail, c.completion_tokens, s.completion_tokens, c, a, larger=longer)


def check_tpot(c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult | None:
    if a.max_tpot_ratio is None:
        return None
    cv, sv = c.vllm.get("tpot_mean"), s.vllm.get("tpot_mean")
    r = CheckResult("tpot", "inconclusive", cv, sv, _ratio(cv, sv), a.max_tpot_ratio)
    if r.ratio is None:
        r.detail = "no vLLM time-per-output-token numbers"
    elif r.ratio <= a.max_tpot_ratio:
        r.status, r.detail = "pass", f"vLLM TPOT ratio {r.ratio:.3g} <= {a.max_tpot_ratio}"
    else:
        r.status, r.detail = "fail", f"vLLM TPOT ratio {r.ratio:.3g} > {a.max_tpot_ratio}"
    return r


def run_checks(ev: Evidence, a: AnalysisSpec) -> list[CheckResult]:
    c, s = ev.canary, ev.stable
    checks = [
        check_error_rate(c, s, a),
        check_latency("latency", c, s, a),
        check_latency("ttft", c, s, a),
        _share_check("finish_length", c.length_finishes, c.finishes, s.length_finishes, s.finishes,
                     a.max_length_share_ratio, a),
        check_completion_tokens(c, s, a),
        _share_check("empty_completions", c.empty, c.completions, s.empty, s.completions,
                     a.max_empty_share_ratio, a),
    ]
    tpot = check_tpot(c, s, a)
    if tpot is not None:
        checks.append(tpot)
    return checks


def judge(ev: Evidence, a: AnalysisSpec) -> Decision:
    checks = run_checks(ev, a)
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        return Decision("rollback", "; ".join(f"{c.name}: {c.detail}" for c in failed), checks)
    if ev.canary.requests < a.min_requests:
        return Decision("hold", f"inconclusive: canary served {ev.canary.requests} requests "
                                f"< min_requests {a.min_requests}", checks)
    unsure = [c for c in checks if c.status == "inconclusive"]
    if unsure:
        return Decision("hold", "inconclusive: " + "; ".join(f"{c.name}: {c.detail}" for c in unsure), checks)
    if all(c.status == "skipped" for c in checks):
        return Decision("hold", "inconclusive: the evidence source gave no numbers to judge", checks)
    return Decision("advance", "every check passed", checks)
