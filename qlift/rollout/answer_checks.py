"""The answer checks (one per ``qlift.quality`` registry entry), decided per request where the window allows.

A share of bad answers compared version against version lets the stable's own noise hide a canary: a stable
that answers its Chinese prompts in English on 20% of answers lets a canary that drifts on 30% of the
English ones pass a 2x ratio. So each answer check runs several tests and splits the check's significance
level between them (Bonferroni):

- over the whole window, and per prompt script (Han, Latin, Cyrillic, ...) when the window has prompts in
  more than one: a canary worse on one language's prompts fails there, even where it is better on another's;
- in a shadow window both versions answered the same prompts, so the test is paired (exact McNemar): the
  prompts where only the canary's answer is flagged against those where only the stable's is, and the
  canary fails when the difference is at least ``min_share_increase`` of the pairs and significant. A split
  window has no pairs: the share ratio over its limit, then a one-sided proportion test (Fisher or z).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qlift.quality.language import prompt_script
from qlift.quality.registry import Answer, AnswerMetric, answer_flags, examples
from qlift.rollout.check_types import CheckResult, CheckStatus, Look, Runner, Window, WindowKind
from qlift.rollout.spec import AnalysisSpec
from qlift.rollout.stats import mcnemar_greater

if TYPE_CHECKING:
    from pathlib import Path

    from qlift.rollout.shadow import ShadowEvidence

ALL = "all prompts"
LOOKS_SHARE = 0.25  # of a split window's answer-check level, what its looks spend in all (look_share)

# checks._share_check: (name, canary hits, canary n, stable hits, stable n, limit, spec, what, alpha=) -> result
ShareTest = Callable[..., CheckResult]


@dataclass
class PairedFlags:
    """One prompt both versions answered: its script and each answer's flag."""

    script: str | None
    canary: bool
    stable: bool


def _flag(a: Answer, name: str, patterns: Path | None) -> bool | None:
    return answer_flags(a, patterns).get(name)


def shadow_answers(ev: ShadowEvidence, patterns: Path | None) -> tuple[list[Answer], list[Answer]]:
    """(canary's, stable's) answers of the pairs both versions answered, in pair order, each with the other's
    text and its own finish reason and tool calls."""
    canary, stable = [], []
    for p in ev.pairs:
        if not (p.primary.ok and p.shadow.ok) or p.primary.text is None or p.shadow.text is None:
            continue
        canary.append(Answer(p.request, p.shadow.text, p.primary.text, patterns, finish_reason=p.shadow.finish_reason,
                             tool_calls=p.shadow.tool_calls))
        stable.append(Answer(p.request, p.primary.text, p.shadow.text, patterns, finish_reason=p.primary.finish_reason,
                             tool_calls=p.primary.tool_calls))
    return canary, stable


def _paired(m: AnswerMetric, ev: ShadowEvidence, patterns: Path | None) -> tuple[list[PairedFlags], list[Answer]]:
    canary, stable = shadow_answers(ev, patterns)
    out = []
    for c, s in zip(canary, stable, strict=True):
        cf, sf = _flag(c, m.name, patterns), _flag(s, m.name, patterns)
        # One side not judgeable (too short to loop or to restate, cut at max_tokens) is not flagged on that
        # side: a short stable answer sets the standard a restating canary answer to the same prompt misses.
        if cf is not None or sf is not None:
            out.append(PairedFlags(prompt_script(c.prompt), bool(cf), bool(sf)))
    return out, canary


def paired_test(name: str, what: str, flags: list[PairedFlags], a: AnalysisSpec, alpha: float) -> CheckResult:
    n = len(flags)
    worse = sum(1 for f in flags if f.canary and not f.stable)
    better = sum(1 for f in flags if f.stable and not f.canary)
    cx, sx = sum(f.canary for f in flags), sum(f.stable for f in flags)
    cshare, sshare = cx / n, sx / n
    r = CheckResult(name, CheckStatus.PASS, cshare, sshare)  # paired: no ratio; the increase decides
    counts = (f"{what}: canary {cx}/{n} vs stable {sx}/{n} on the same prompts; only the canary's in {worse}, "
              f"only the stable's in {better}")
    increase = (worse - better) / n
    if increase < a.min_share_increase:
        r.detail = counts + f" (canary worse on {increase:.3g} of the pairs, under {a.min_share_increase})"
        return r
    t = mcnemar_greater(worse, better)
    r.test, r.p_value = t.test, t.p_value
    r.status = CheckStatus.FAIL if t.p_value < alpha else CheckStatus.INCONCLUSIVE
    r.detail = counts + f"; {t.test} p={t.p_value:.3g}" + ("" if r.status == CheckStatus.FAIL else
                                                             " (not significant)")
    return r


def script_strata(scripts: list[str | None]) -> list[str]:
    """The prompt scripts a window is tested by: every known one, when there are two or more."""
    known = sorted({s for s in scripts if s is not None})
    return known if len(known) > 1 else []


def decide(results: list[tuple[str, CheckResult]]) -> CheckResult:
    """One verdict from a check's tests: the most significant failure, else inconclusive if any test is,
    else the whole window's pass. A stratum's result names its prompts in the detail."""
    def named(label: str, r: CheckResult) -> CheckResult:
        if label != ALL:
            r.detail = f"on {label} prompts: {r.detail}"
        return r

    failed = [(lab, r) for lab, r in results if r.status == CheckStatus.FAIL]
    if failed:
        return named(*min(failed, key=lambda lr: lr[1].p_value if lr[1].p_value is not None else 1.0))
    held = [(lab, r) for lab, r in results if r.status == CheckStatus.INCONCLUSIVE]
    return named(*(held[0] if held else results[0]))


def run_shadow(m: AnswerMetric, w: Window, a: AnalysisSpec, alpha: float) -> CheckResult | None:
    """The paired tests of a shadow window; None when no pair has the flag on both sides."""
    assert w.pairs is not None
    flags, canary = _paired(m, w.pairs, a.refusal_patterns)
    if not flags:
        return None
    strata = script_strata([f.script for f in flags])
    level = alpha / (1 + len(strata))
    results = [(ALL, paired_test(m.name, f"share of {m.what}", flags, a, level))]
    results += [(s, paired_test(m.name, f"share of {m.what}", [f for f in flags if f.script == s], a, level))
                for s in strata]
    r = decide(results)
    if r.status != CheckStatus.PASS or any(f.canary for f in flags):
        r.examples = examples(canary, m.name, a.refusal_patterns)
    return r


def run_split(m: AnswerMetric, w: Window, a: AnalysisSpec, alpha: float, share_test: ShareTest) -> CheckResult | None:
    """Unpaired share tests (``share_test``: the registry's) over the window and per prompt script; None when the
    metric applies to no answer of a version."""
    assert w.canary.answers is not None and w.stable.answers is not None
    limit = a.share_limit(m.name)

    def counted(answers: list[Answer]) -> list[tuple[str | None, bool]]:
        return [(prompt_script(x.prompt), v) for x in answers
                if (v := _flag(x, m.name, a.refusal_patterns)) is not None]

    canary, stable = counted(w.canary.answers), counted(w.stable.answers)
    if not canary or not stable:
        return None
    strata = [s for s in script_strata([s for s, _ in canary + stable])
              if any(x == s for x, _ in canary) and any(x == s for x, _ in stable)]
    level = alpha / (1 + len(strata))

    def test(c: list[bool], s: list[bool]) -> CheckResult:
        return share_test(m.name, sum(c), len(c), sum(s), len(s), limit, a, f"share of {m.what}", alpha=level)

    results = [(ALL, test([v for _, v in canary], [v for _, v in stable]))]
    results += [(st, test([v for x, v in canary if x == st], [v for x, v in stable if x == st])) for st in strata]
    r = decide(results)
    if r.status != CheckStatus.PASS or any(v for _, v in canary):
        r.examples = examples(w.canary.answers, m.name, a.refusal_patterns)
    return r


def look_share(look: Look | None, sequential: bool) -> float:
    """The share of a split window's answer-check level that one test spends. Sequential (alpha spending with
    t squared, Bonferroni over the looks): the looks at a window in progress spend LOOKS_SHARE of it in all, each
    the growth of LOOKS_SHARE x t^2 since the last (t: the share of the interval gone), and the window's end the
    rest. The looks and the end together never spend more than the level, however many looks there were; a bad
    canary is seen early, when few users have read it, and a healthy one is judged at 3/4 of the level."""
    if not sequential:
        return 1.0 if look is None else 0.0
    if look is None:
        return 1 - LOOKS_SHARE
    return LOOKS_SHARE * (min(look.now, 1.0) ** 2 - min(look.before, 1.0) ** 2)


def answer_check(m: AnswerMetric, *, alpha_of: Callable[[AnalysisSpec], float], share_test: ShareTest) -> Runner:
    """The registry's runner for ``m``: paired in shadow windows, stratified everywhere; ``alpha_of`` and
    ``share_test`` are the registry's per-check level and unpaired share test (checks.py passes them in)."""

    def run(w: Window, a: AnalysisSpec) -> CheckResult:
        if w.canary.answers is None or w.stable.answers is None:
            r = CheckResult(m.name, CheckStatus.SKIPPED, limit=a.share_limit(m.name))
            r.detail = "the evidence source sees no answers (the qlift router's request log and shadow pairs do)"
            return r
        shadow = w.kind == WindowKind.SHADOW and w.pairs is not None
        if shadow:
            got = run_shadow(m, w, a, alpha_of(a))
        else:
            level = alpha_of(a) * look_share(w.look, a.early_answer_checks)
            got = run_split(m, w, a, level, share_test) if level > 0 else None
        if got is None:
            r = CheckResult(m.name, CheckStatus.SKIPPED, limit=a.share_limit(m.name))
            r.detail = f"applies to no answer of both versions in this window ({m.applies})"
            return r
        return got
    return run
