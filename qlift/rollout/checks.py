"""The judge's checks as data: one entry per check in ``CHECKS``.

An entry names the check, the evidence fields it reads, the statistic that decides it, the
``AnalysisSpec`` fields that set its limits, whether it runs a significance test (those share
the window's ``alpha``, Bonferroni), whether it may end a window early, the function the judge
runs, and its PromQL form for an Argo ``AnalysisTemplate``. The judge, the Bonferroni count,
``status`` output and ``qlift.deploy.argo`` all read this table: adding a check is one entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from qlift.quality.registry import ANSWER_METRICS
from qlift.rollout.answer_checks import answer_check
from qlift.rollout.check_types import BOTH, CheckResult, CheckStatus, Runner, Window, WindowKind
from qlift.rollout.evidence import VersionEvidence
from qlift.rollout.length_shapes import shape_matched
from qlift.rollout.pair_checks import check_agreement, check_json_valid, check_judge_model
from qlift.rollout.promql_forms import (  # noqa: F401  (PromqlMetric re-exported: deploy.argo imports it here)
    ArgoForm,
    Promql,
    PromqlMetric,
    argo_empty,
    argo_errors,
    argo_finish_length,
    argo_latency,
    argo_requests,
    argo_tokens,
)
from qlift.rollout.read_checks import check_stable_reads
from qlift.rollout.spec import AnalysisSpec
from qlift.rollout.stats import TestResult, binomial_greater, mann_whitney_greater, proportion_greater


@dataclass(frozen=True)
class Check:
    name: str
    reads: tuple[str, ...]  # VersionEvidence fields
    statistic: str  # what decides, in words (status and docs show it)
    limits: tuple[str, ...]  # AnalysisSpec fields
    tested: bool  # runs a one-sided test at alpha / (number of tested checks)
    early: bool  # significant before the window's end ends the window (the controller's peek)
    run: Runner
    argo: ArgoForm | None
    doc: str
    applies: frozenset[WindowKind] = BOTH  # the kinds of window it runs in

    def describe(self, a: AnalysisSpec) -> dict[str, object]:
        """What this check compares under ``a`` (for `status` and docs)."""
        return {"name": self.name, "doc": self.doc, "reads": list(self.reads), "statistic": self.statistic,
                "limits": {f: getattr(a, f) for f in self.limits}, "tested": self.tested}


# -- statistics shared by the checks -------------------------------------------------------


def tested_checks() -> int:
    """The tested checks of a split window that sees answers, without a judge model or the stable's reads: what
    ``alpha`` is divided by before a window's own family is known (``window_spec`` rescales it to the window's)."""
    return sum(1 for c in CHECKS if c.tested and WindowKind.SPLIT in c.applies and c.reads not in WINDOW_EXTRAS)


def check_alpha(a: AnalysisSpec) -> float:
    """Per-check significance: ``alpha`` is the family-wise level of one window (Bonferroni over the
    tested checks), so several tests a window do not turn noise into a rollback one time in twenty."""
    return a.alpha / tested_checks()


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


def _samples_test(x: list[float], y: list[float], a: AnalysisSpec, *, larger: bool) -> TestResult | None:
    if len(x) < a.min_samples or len(y) < a.min_samples:
        return None
    return mann_whitney_greater(x, y) if larger else mann_whitney_greater(y, x)


def _rank_verdict(r: CheckResult, detail: str, canary: list[float], stable: list[float], c: VersionEvidence,
                  a: AnalysisSpec, *, larger: bool) -> CheckResult:
    """A ratio past its limit fails only where a Mann-Whitney U test on the samples agrees."""
    t = _samples_test(canary, stable, a, larger=larger)
    if t is None and (canary or stable):
        r.detail = detail + f" (fewer than {a.min_samples} samples a version for a rank test yet)"
        return r
    if t is None:  # a quantile-only source (Prometheus): the ratio decides once there is traffic
        enough = c.requests >= quantile_only_requests(a)
        r.status = CheckStatus.FAIL if enough else CheckStatus.INCONCLUSIVE
        r.detail = detail + (" (no samples for a rank test)" if enough else " (too few requests yet)")
        return r
    r.test, r.p_value = t.test, t.p_value
    r.status = CheckStatus.FAIL if t.p_value < check_alpha(a) else CheckStatus.INCONCLUSIVE
    r.detail = f"{detail}; mann-whitney p={t.p_value:.3g}" + (
        "" if r.status == CheckStatus.FAIL else " (not significant)")
    return r


MIN_REST_SHARE = 0.2


def _share_check(name: str, cx: int | None, cn: int | None, sx: int | None, sn: int | None,
                 limit: float, a: AnalysisSpec, what: str, rest: str = "", alpha: float | None = None
                 ) -> CheckResult:
    """The canary's share of ``what`` against the stable's: worse when the ratio is over ``limit`` (or, with
    ``rest`` named, when the complementary shares are under 1/``limit`` of each other) and the share is also
    ``min_share_increase`` higher; then worse only if a one-sided proportion test says so (at ``alpha``,
    default the check's level)."""
    cshare = cx / cn if cx is not None and cn else None
    sshare = sx / sn if sx is not None and sn else None
    r = CheckResult(name, CheckStatus.INCONCLUSIVE, cshare, sshare, _ratio(cshare, sshare), limit)
    if cn is None or cx is None:
        r.status, r.detail = CheckStatus.SKIPPED, f"the evidence source has no {name} counts"
        return r
    if cshare is None or sshare is None or sn is None or sx is None:
        r.detail = "no answers to compare yet"
        return r
    assert r.ratio is not None
    # A stable that rarely stops on its own (an 89%-cut one) sets no standard for the rest: ratio only there.
    rest_low = bool(rest) and 1.0 - sshare >= MIN_REST_SHARE and (1.0 - cshare) * limit < 1.0 - sshare
    worse = (r.ratio > limit or rest_low) and cshare - sshare >= a.min_share_increase
    if not worse:
        r.status = CheckStatus.PASS
        r.detail = (f"{what}: canary {cshare:.3g} vs stable {sshare:.3g} (ratio {r.ratio:.3g} <= {limit} or less "
                    f"than {a.min_share_increase} higher)")
        return r
    t = proportion_greater(cx, cn, sx, sn)
    r.test, r.p_value = t.test, t.p_value
    r.status = CheckStatus.FAIL if t.p_value < (check_alpha(a) if alpha is None else alpha) \
        else CheckStatus.INCONCLUSIVE
    how = (f"ratio {r.ratio:.3g} > {limit}" if r.ratio > limit else
           f"{rest} {1 - cshare:.3g} vs {1 - sshare:.3g}, under 1/{limit} of the stable's")
    r.detail = (f"{what}: canary {cshare:.3g} ({cx}/{cn}) vs stable {sshare:.3g} ({sx}/{sn}), {how}; "
                f"{t.test} p={t.p_value:.3g}" + ("" if r.status == CheckStatus.FAIL else " (not significant)"))
    return r


# -- the checks ------------------------------------------------------------------------------


def check_canary_requests(c: VersionEvidence, s: VersionEvidence, need: int) -> CheckResult:
    """``need``: the window's ``min_count`` (min_requests; a shadow window's min_pairs)."""
    r = CheckResult("canary_requests", CheckStatus.PASS, float(c.requests), float(s.requests), limit=float(need))
    if c.requests < need:
        r.status = CheckStatus.INCONCLUSIVE
        r.detail = f"insufficient traffic: canary served {c.requests} requests < min_requests {need}"
    else:
        r.detail = f"canary served {c.requests} requests >= min_requests {need}"
    return r


def check_error_rate(c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult:
    """Errors include answers that are not answers (HTTP 200 with a body that is no completion):
    a canary that fails significantly is rolled back in its first window, below min_requests too."""
    r = CheckResult("error_rate", CheckStatus.INCONCLUSIVE, c.error_rate, s.error_rate, limit=a.max_error_rate)
    if c.errors is None:
        r.status, r.detail = CheckStatus.SKIPPED, "the evidence source does not count errors"
        return r
    rate = c.error_rate or 0.0
    bad = f", {c.bad_answers} of them unparseable or empty answers" if c.bad_answers else ""
    if rate <= a.max_error_rate:
        r.status, r.detail = CheckStatus.PASS, f"canary error rate {rate:.3g} <= {a.max_error_rate}"
        return r
    # Above the limit: is the canary worse than the stable, or is something shared failing?
    if s.errors is not None and s.requests >= a.min_samples:
        t = proportion_greater(c.errors, c.requests, s.errors, s.requests)
    else:
        t = binomial_greater(c.errors, c.requests, a.max_error_rate)
    r.test, r.p_value = t.test, t.p_value
    significant = t.p_value < check_alpha(a)
    r.status = CheckStatus.FAIL if significant else CheckStatus.INCONCLUSIVE
    r.detail = (f"canary error rate {rate:.3g} ({c.errors}/{c.requests}{bad}) > {a.max_error_rate}, stable "
                f"{_fmt(s.error_rate)}; {t.test} p={t.p_value:.3g}" + ("" if significant else " (not significant)"))
    return r


def _check_latency(name: str, c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult:
    """``latency`` compares e2e seconds per completion token when both versions have enough such
    samples (verbosity is the completion_tokens check's business), else e2e seconds; ``ttft`` compares
    streamed requests only (a non-streamed request's first byte is its whole answer)."""
    limit, tolerance, kind = a.max_ttft_ratio, a.min_ttft_increase_s, name
    if name == "latency":
        limit, tolerance = a.max_latency_ratio, a.min_latency_increase_s
        if c.token_latency_s and s.token_latency_s:
            kind, tolerance = "token_latency", a.min_token_latency_increase_s
    q = a.latency_quantile
    cv, sv = c.latency_quantile(kind, q), s.latency_quantile(kind, q)
    r = CheckResult(name, CheckStatus.INCONCLUSIVE, cv, sv, _ratio(cv, sv), limit)
    if cv is None or sv is None:
        if name == "ttft" and (c.latency_s or s.latency_s):
            r.status = CheckStatus.SKIPPED
            r.detail = "no streamed requests on " + ("the canary" if cv is None else "the stable") + \
                       " (TTFT is judged on streamed requests only)"
        else:
            r.status = CheckStatus.SKIPPED if not (c.latency_s or c.ttft_s or c.quantiles) else CheckStatus.INCONCLUSIVE
            r.detail = f"no {kind} numbers for " + ("the canary" if cv is None else "the stable")
        return r
    label = f"{kind} p{round(q * 100)}"
    assert r.ratio is not None
    if r.ratio <= limit or cv - sv <= tolerance:
        r.status = CheckStatus.PASS
        r.detail = f"{label} canary {cv:.3g}s / stable {sv:.3g}s = {r.ratio:.3g} " + (
            f"<= {limit}" if r.ratio <= limit else f"(within {tolerance}s)")
        return r
    samples = {"latency": (c.latency_s, s.latency_s), "ttft": (c.ttft_s, s.ttft_s),
               "token_latency": (c.token_latency_s, s.token_latency_s)}[kind]
    detail = f"{label} canary {cv:.3g}s / stable {sv:.3g}s = {r.ratio:.3g} > {limit}"
    return _rank_verdict(r, detail, samples[0], samples[1], c, a, larger=True)


def check_latency(c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult:
    return _check_latency("latency", c, s, a)


def check_ttft(c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult:
    return _check_latency("ttft", c, s, a)


def check_finish_length(c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult:
    """Rambling: the canary is cut at max_tokens significantly more often than the stable. Against a stable
    that is itself often cut the ratio saturates (at 70% cut, a canary cut every time reads 1.43x and passed a
    1.5 limit on an AVX2 machine), so the shares that stopped on their own are held to the same limit."""
    return _share_check("finish_length", c.length_finishes, c.finishes, s.length_finishes, s.finishes,
                        a.max_length_share_ratio, a, "share cut at max_tokens", rest="stopped on their own")


def quiet_limit(s: VersionEvidence, a: AnalysisSpec) -> float:
    """The lowest canary/stable mean-tokens ratio that passes, down-weighted by the share of the
    stable's answers cut at max_tokens: a stable that rambles to the limit sets no standard of length
    (at 89% cut, an answer a quarter its length is a style, not silence; empty answers are their own check)."""
    share = s.length_share or 0.0
    return a.min_tokens_ratio * (1.0 - share)


def check_completion_tokens(c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult:
    """Mean answer lengths, the canary's against the stable's on the same request shapes where the answers tell
    them (``qlift.rollout.length_shapes``: a window's mix of short and long kinds of request is chance), else
    pooled; a ratio past its limit fails where a rank test agrees."""
    by_shape = shape_matched(c, s, a.min_samples)
    cv, sv = (by_shape.observed, by_shape.expected) if by_shape else (c.mean_completion_tokens,
                                                                      s.mean_completion_tokens)
    r = CheckResult("completion_tokens", CheckStatus.INCONCLUSIVE, cv, sv, _ratio(cv, sv), a.max_tokens_ratio)
    if c.completions is None:
        r.status, r.detail = CheckStatus.SKIPPED, "the evidence source has no completion token counts"
        return r
    if cv is None or sv is None or r.ratio is None:
        r.detail = "no answers to compare yet"
        return r
    lo = quiet_limit(s, a)
    cut = f" (stable cut at max_tokens in {s.length_share:.0%}: lower limit {lo:.3g})" if s.length_share else ""
    where = f" {by_shape.describe()}" if by_shape else ""
    if lo <= r.ratio <= a.max_tokens_ratio:
        r.status = CheckStatus.PASS
        r.detail = f"mean completion tokens canary {cv:.3g} / stable {sv:.3g}{where} = {r.ratio:.3g} " \
                   f"within [{lo:.3g}, {a.max_tokens_ratio}]" + cut
        return r
    longer = r.ratio > a.max_tokens_ratio
    r.limit = a.max_tokens_ratio if longer else lo
    what = "verbose" if longer else "goes quiet"
    detail = f"canary {what}: mean completion tokens {cv:.3g} vs {sv:.3g}{where} (ratio {r.ratio:.3g})" + cut
    if not longer:
        detail += completeness(c)
    samples = (by_shape.canary, by_shape.stable) if by_shape else (c.completion_tokens, s.completion_tokens)
    return _rank_verdict(r, detail, *samples, c, a, larger=longer)


def completeness(c: VersionEvidence) -> str:
    """Whether a quiet canary's short answers were complete or cut off (the ``unfinished`` answer flag): a
    complete, correct short answer is a style a person may accept; a cut-off one is not."""
    from qlift.quality.registry import answer_flags

    flags = [f for x in c.answers or [] if (f := answer_flags(x).get("unfinished")) is not None]
    if not flags:
        return ""
    cut_off = sum(flags)
    return (f"; {len(flags) - cut_off} of its {len(flags)} answers end complete, {cut_off} cut off mid-sentence"
            + (" (short but complete: a style? --min-tokens-ratio lowers the limit)" if cut_off * 10 < len(flags)
               else ""))


def check_empty_completions(c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult:
    return _share_check("empty_completions", c.empty, c.completions, s.empty, s.completions,
                        a.max_empty_share_ratio, a, "share of empty answers")


def check_tpot(c: VersionEvidence, s: VersionEvidence, a: AnalysisSpec) -> CheckResult | None:
    if a.max_tpot_ratio is None:
        return None
    cv, sv = c.vllm.get("tpot_mean"), s.vllm.get("tpot_mean")
    r = CheckResult("tpot", CheckStatus.INCONCLUSIVE, cv, sv, _ratio(cv, sv), a.max_tpot_ratio)
    if r.ratio is None:
        r.detail = "no vLLM time-per-output-token numbers"
    elif r.ratio <= a.max_tpot_ratio:
        r.status, r.detail = CheckStatus.PASS, f"vLLM TPOT ratio {r.ratio:.3g} <= {a.max_tpot_ratio}"
    else:
        r.status, r.detail = CheckStatus.FAIL, f"vLLM TPOT ratio {r.ratio:.3g} > {a.max_tpot_ratio}"
    return r


def answer_checks() -> tuple[Check, ...]:
    return tuple(Check(m.name, ("answers",), "split: share ratio, then one-sided proportion test; shadow: paired "
                       "McNemar; each over the window and per prompt script",
                       (m.limit, "min_share_increase"), tested=True, early=True,
                       run=answer_check(m, alpha_of=check_alpha, share_test=_share_check), argo=None,
                       doc=m.doc) for m in ANSWER_METRICS)


def versions(check: Callable[[VersionEvidence, VersionEvidence, AnalysisSpec], CheckResult | None]) -> Runner:
    """A check of the two versions' evidence alone, as the registry runs it."""
    return lambda w, a: check(w.canary, w.stable, a)


def _canary_requests(w: Window, a: AnalysisSpec) -> CheckResult:
    r = check_canary_requests(w.canary, w.stable, w.min_count)
    if w.kind == WindowKind.SHADOW:  # a shadow window counts answered pairs (its min_count is shadow.min_pairs)
        r.detail = r.detail.replace("requests", "shadow pairs").replace("min_shadow pairs", "min_pairs")
    return r


def _json_valid(w: Window, a: AnalysisSpec) -> CheckResult | None:
    return None if w.pairs is None or w.shadow is None else check_json_valid(w.pairs, w.shadow, a, check_alpha(a))


def _agreement(w: Window, a: AnalysisSpec) -> CheckResult | None:
    if w.pairs is None or w.shadow is None:
        return None
    return check_agreement(w.pairs, w.shadow, a, check_alpha(a), pass_alpha=w.alpha)


def _judge(w: Window, a: AnalysisSpec) -> CheckResult | None:
    return None if w.judge_margin is None else check_judge_model(w.judged, w.judge_margin, check_alpha(a))


def _stable_reads(w: Window, a: AnalysisSpec) -> CheckResult | None:
    return check_stable_reads(w.reads, w.kind, a, check_alpha(a))


CHECKS: tuple[Check, ...] = (
    Check("canary_requests", ("requests",), "count >= limit", ("min_requests",), tested=False, early=False,
          run=_canary_requests, argo=argo_requests,
          doc="Enough canary traffic to judge; too little pauses (on_insufficient), never fails."),
    Check("error_rate", ("requests", "errors", "bad_answers"),
          "rate <= limit, else one-sided two-proportion (vs stable) or binomial (vs limit) test",
          ("max_error_rate",), tested=True, early=True, run=versions(check_error_rate), argo=argo_errors,
          doc="5xx, connection errors, and 200 answers that are not answers (unparseable, no choices, "
              "a stream without [DONE])."),
    Check("latency", ("token_latency_s", "latency_s"), "quantile ratio, then one-sided Mann-Whitney U",
          ("max_latency_ratio", "latency_quantile", "min_latency_increase_s", "min_token_latency_increase_s"),
          tested=True, early=False, run=versions(check_latency),
          argo=argo_latency("latency", "latency-ratio", "max_latency_ratio", "min_latency_increase_s"),
          doc="Seconds per completion token (e2e when tokens are unknown); streamed and non-streamed."),
    Check("ttft", ("ttft_s",), "quantile ratio, then one-sided Mann-Whitney U",
          ("max_ttft_ratio", "latency_quantile", "min_ttft_increase_s"), tested=True, early=False,
          run=versions(check_ttft), argo=argo_latency("ttft", "ttft-ratio", "max_ttft_ratio", "min_ttft_increase_s"),
          doc="Time to first token of streamed requests only."),
    Check("finish_length", ("finishes", "length_finishes"), "share ratio, then one-sided proportion test",
          ("max_length_share_ratio", "min_share_increase"), tested=True, early=False,
          run=versions(check_finish_length), argo=argo_finish_length,
          doc="Rambles: cut at max_tokens significantly more often than the stable."),
    Check("completion_tokens", ("completion_tokens", "completions", "completion_tokens_sum", "answers"),
          "mean ratio within [min_tokens_ratio x (1 - stable cut share), max_tokens_ratio] (by request shape where "
          "answers tell shapes), then Mann-Whitney U",
          ("min_tokens_ratio", "max_tokens_ratio"), tested=True, early=False, run=versions(check_completion_tokens),
          argo=argo_tokens, doc="Goes quiet (relative to an uncut stable) or verbose."),
    Check("empty_completions", ("completions", "empty"), "share ratio, then one-sided proportion test",
          ("max_empty_share_ratio", "min_share_increase"), tested=True, early=True,
          run=versions(check_empty_completions), argo=argo_empty, doc="Answers with zero completion tokens."),
    Check("tpot", ("vllm",), "vLLM mean time per output token ratio <= limit (only when set)", ("max_tpot_ratio",),
          tested=False, early=False, run=versions(check_tpot), argo=None, doc="The engine's own per-token time.",
          applies=frozenset({WindowKind.SPLIT})),
    *answer_checks(),
    # the checks of answer pairs (pair_checks.py): the shadow phase's, and the judge model's wherever it ran
    Check("json_valid", ("pairs",), "share not JSON where JSON was asked, then one-sided proportion test",
          ("min_share_increase",), tested=True, early=False, run=_json_valid, argo=None,
          doc="Not JSON where the prompt asked for JSON (shadow.max_json_invalid_share).",
          applies=frozenset({WindowKind.SHADOW})),
    Check("agreement", ("pairs",), "mean ROUGE-L F1 >= limit, else Mann-Whitney U: own prompt vs others'",
          ("min_samples",), tested=True, early=False, run=_agreement, argo=None,
          doc="The canary's answer fits its own prompt's stable answer (shadow.min_agreement).",
          applies=frozenset({WindowKind.SHADOW})),
    Check("judge", ("judged",), "loss - win share <= margin, else one-sided sign test", (), tested=True,
          early=False, run=_judge, argo=None,
          doc="A judge model prefers the stable's answer (shadow.judge, shadow.max_judge_loss_margin)."),
    # the stable model's reading of both versions' answers, where the stable is a vLLM server (read_checks.py)
    Check("stable_reads", ("reads",), "mean NLL (and share of tokens under log-probability -12) increase <= "
          "limit, else one-sided Wilcoxon signed-rank (shadow) or Mann-Whitney U (split), per prompt script",
          ("max_nll_increase", "max_low_prob_share_increase"), tested=True, early=False, run=_stable_reads,
          argo=None, doc="The stable model finds the canary's answers less likely after their requests than its own "
          "(misdecoded text, deflections, answers off its distribution)."),
)
# what only some windows have: a judge model's verdicts, the stable's reading of the answers (its server is vLLM)
WINDOW_EXTRAS = (("judged",), ("reads",))
BY_NAME = {c.name: c for c in CHECKS}


def family(w: Window) -> int:
    """The tested checks this window can feed: its Bonferroni family. Answer checks join it only where the
    source sees answers (a Prometheus window is judged at the level it always was), the pair checks in shadow
    windows, the judge model's where it ran."""
    return sum(1 for k in CHECKS if k.tested and w.feeds(k))


def window_spec(w: Window, a: AnalysisSpec) -> AnalysisSpec:
    """``a`` with alpha scaled so that ``check_alpha`` divides it by this window's family instead of by
    ``tested_checks``."""
    return a.model_copy(update={"alpha": a.alpha * tested_checks() / family(w)})


def run_checks(w: Window, a: AnalysisSpec, *, early_only: bool = False) -> list[CheckResult]:
    """Every check that applies to ``w``'s kind, in the registry's order, at the window's Bonferroni level."""
    w.alpha = a.alpha
    a = window_spec(w, a)
    out = []
    for check in CHECKS:
        if w.kind not in check.applies or (early_only and not check.early):
            continue
        r = check.run(w, a)
        if r is not None:
            out.append(r)
    return out


def describe(a: AnalysisSpec) -> list[dict[str, object]]:
    """Every check of a split window with its limits under ``a`` (what `status` shows the judge compares)."""
    return [c.describe(a) for c in CHECKS if WindowKind.SPLIT in c.applies and c.reads not in WINDOW_EXTRAS
            and (c.name != "tpot" or a.max_tpot_ratio is not None)]


def argo_metrics(preset: dict[str, str], a: AnalysisSpec, window: str) -> list[PromqlMetric]:
    p = Promql(preset, window)
    return [m for c in CHECKS if c.argo is not None for m in c.argo(p, a)]
