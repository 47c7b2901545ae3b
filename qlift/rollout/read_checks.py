"""The ``stable_reads`` check: the canary's answers, read by the stable model, against the stable's own answers.

Two numbers per answer (stable_reads.py): its mean negative log-likelihood per token (NLL, nats) and the share of
its tokens under log-probability -12. For each, the canary fails where its figure (the mean NLL of its answers;
the share of all their tokens) is above the stable's by more than the margin (``max_nll_increase``,
``max_low_prob_share_increase``) AND a one-sided rank test says the canary's
are larger: paired in a shadow window (both answered the same prompts: Wilcoxon signed-rank on the differences),
two-sample in a split window (Mann-Whitney U). A canary that only words things its own way stays within the
margin; one past it on too few answers for a test holds. The tests run over the window and per prompt script
(as the answer checks do), the check's level split between them (Bonferroni). A scorer that was down or slow
(nothing scored) is inconclusive, never a failure.
"""

from __future__ import annotations

from collections.abc import Callable

from qlift.quality.scorer import LOW_LOGPROB
from qlift.rollout.answer_checks import ALL, decide, script_strata
from qlift.rollout.check_types import CheckResult, CheckStatus, WindowKind
from qlift.rollout.spec import AnalysisSpec
from qlift.rollout.stable_reads import CANARY, STABLE, ReadAnswer, StableReads
from qlift.rollout.stats import mann_whitney_greater, mean, wilcoxon_greater

NAME = "stable_reads"
EXAMPLES = 3


def mean_nll(answers: list[ReadAnswer]) -> float:
    """The mean of the answers' mean NLL per token: each answer weighs the same."""
    return mean([x.nll for x in answers]) or 0.0


def low_share(answers: list[ReadAnswer]) -> float:
    """The share of all the answers' scored tokens under the low log-probability: one unlikely token in a short
    answer (an emoji sign-off, a rare name) weighs as little as in a long one."""
    tokens = sum(x.tokens for x in answers)
    return sum(x.low_share * x.tokens for x in answers) / tokens if tokens else 0.0


# (what it is in words, how it reads, the AnalysisSpec margin, the version's figure the margin compares, one
# answer's value the rank test compares)
METRICS: dict[str, tuple[str, Callable[[float], str], str, Callable[[list[ReadAnswer]], float],
                         Callable[[ReadAnswer], float]]] = {
    "nll": ("mean NLL per answer token", lambda x: f"{x:.3g} nats", "max_nll_increase", mean_nll, lambda x: x.nll),
    "low_share": (f"share of answer tokens under log-probability {LOW_LOGPROB:g}", lambda x: f"{x:.2%}",
                  "max_low_prob_share_increase", low_share, lambda x: x.low_share),
}


def _test(metric: str, canary: list[ReadAnswer], stable: list[ReadAnswer], paired: bool, a: AnalysisSpec,
          level: float) -> CheckResult:
    """The version's figures against the margin; past it, a one-sided rank test of the answers' own values."""
    what, shown, limit, figure, value = METRICS[metric]
    margin = getattr(a, limit)
    cv, sv = figure(canary), figure(stable)
    increase = cv - sv
    r = CheckResult(NAME, CheckStatus.PASS)
    count = f"{len(canary)} pairs" if paired else f"{len(canary)} and {len(stable)} answers"
    r.detail = f"{what} under the stable model: canary {shown(cv)} vs stable {shown(sv)} over {count}"
    if increase <= margin:
        r.detail += f" (+{shown(max(increase, 0.0))} <= {limit} {margin:g})"
        return r
    r.status = CheckStatus.INCONCLUSIVE
    r.detail += f": +{shown(increase)} > {limit} {margin:g}"
    if min(len(canary), len(stable)) < a.min_samples:
        r.detail += f" (fewer than min_samples {a.min_samples}: no test yet)"
        return r
    cs, ss = [value(x) for x in canary], [value(x) for x in stable]
    t = wilcoxon_greater([c - s for c, s in zip(cs, ss, strict=True)]) if paired else mann_whitney_greater(cs, ss)
    r.test, r.p_value = t.test, t.p_value
    r.status = CheckStatus.FAIL if t.p_value < level else CheckStatus.INCONCLUSIVE
    r.detail += f"; {t.test} p={t.p_value:.3g}" + ("" if r.status == CheckStatus.FAIL else " (not significant)")
    return r


def _examples(canary: list[ReadAnswer], stable_nll: float | None, low: float) -> list[dict[str, str | None]]:
    """The canary's answers the stable found least likely, with their scores (``evidence``, which `status` shows)."""
    own = "" if stable_nll is None else f" (its own answers: {stable_nll:.2f})"
    return [{"prompt": x.prompt, "answer": x.text, "other": None,
             "evidence": f"the stable model's NLL {x.nll:.2f} nats/token{own}, {x.low_share:.0%} of {x.tokens} "
                         f"tokens under log-probability {low:g}"}
            for x in sorted(canary, key=lambda x: -x.nll)[:EXAMPLES]]


def check_stable_reads(reads: StableReads | None, kind: WindowKind, a: AnalysisSpec, alpha: float
                       ) -> CheckResult | None:
    """The check over one window's reads (None where the stable reads nothing: ``analysis.stable_reads`` off)."""
    if reads is None:
        return None
    r = CheckResult(NAME, CheckStatus.INCONCLUSIVE)
    if reads.skipped is not None:
        r.status, r.detail = CheckStatus.SKIPPED, reads.skipped
        return r
    paired = kind == WindowKind.SHADOW
    couples = reads.pairs() if paired else []
    canary = [c for c, _ in couples] if paired else reads.side(CANARY)
    stable = [s for _, s in couples] if paired else reads.side(STABLE)
    if not canary or not stable:
        why = "; ".join(reads.notes) or "no answer scored"
        r.detail = f"the stable scored {len(reads.answers)} of {reads.sampled} answers ({why}): inconclusive, " \
                   "never a failure"
        return r
    # a script is tested on its own where both versions have min_samples answers to its prompts
    strata = [s for s in script_strata([x.script for x in canary + stable])
              if min(sum(x.script == s for x in canary), sum(x.script == s for x in stable)) >= a.min_samples]
    level = alpha / (len(METRICS) * (1 + len(strata)))
    results = []
    for label in [ALL, *strata]:
        if paired:
            kept = [(c, s) for c, s in couples if label == ALL or c.script == label]
            cs, ss = [c for c, _ in kept], [s for _, s in kept]
        else:
            cs = [x for x in canary if label == ALL or x.script == label]
            ss = [x for x in stable if label == ALL or x.script == label]
        for metric in METRICS:
            t = _test(metric, cs, ss, paired, a, level)
            t.canary, t.stable = mean_nll(cs), mean_nll(ss)
            results.append((label, t))
    out = decide(results)
    if out.status == CheckStatus.PASS:
        out.detail = "; ".join(t.detail for label, t in results if label == ALL)
    else:
        out.examples = _examples(canary, mean([x.nll for x in stable]), LOW_LOGPROB)
    cost = f"{reads.model}: {len(reads.answers)} of {reads.sampled} answers scored in {reads.seconds:.1f}s"
    out.detail = f"{cost}; {out.detail}" + (f" ({'; '.join(reads.notes)})" if reads.notes else "")
    return out
