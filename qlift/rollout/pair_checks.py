"""The checks that read what only some windows have: a shadow window's answer pairs (``json_valid``,
``agreement``) and the judge model's verdicts on sampled pairs (``judge``, in shadow windows and, with
``shadow.judge_split_percent``, in split windows). They are entries of the one registry (checks.CHECKS), run
by the one judge; each takes the window's per-check significance level (``alpha``) from it.

- ``json_valid``: where the prompt asked for JSON (``response_format`` json_object/json_schema, JSON named in
  the system prompt or asked for by the user), the canary's answers that do not parse, against the stable's
  answers to the same prompts (paired: McNemar);
- ``agreement``: ROUGE-L F1 between the two answers to the same prompt (qlift.eval's scorer). A canary that
  changes style on purpose (short JSON for prose) agrees little word for word, but its answer still shares the
  prompt's particulars with the stable's answer to that prompt, more than with the stable's answers to other
  prompts. So the check passes on a mean agreement at or above ``min_agreement`` (near-identical answers), or
  on agreement with the same prompt's answer significantly above that with other prompts' answers (one-sided
  Mann-Whitney); it fails when neither holds over ``min_pairs``: an answer that fits any prompt as well as its
  own is no answer to it (templated JSON for another ticket agrees ~0.5 with every ticket's answer);
- ``judge``: the judge model prefers the stable's answer by more than a margin of the judged pairs, and a
  one-sided sign test agrees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qlift.quality.judge import sample
from qlift.rollout.check_types import CheckResult, CheckStatus
from qlift.rollout.spec import AnalysisSpec, ShadowSpec
from qlift.rollout.stats import binomial_greater, mann_whitney_greater, mcnemar_greater, mean

if TYPE_CHECKING:
    from qlift.quality.judge import JudgeResult
    from qlift.rollout.shadow import ShadowEvidence

# ROUGE-L grows with the product of the answers' lengths (bit-parallel: ~1 ms for two 900-word answers on a
# Zen 5 core), so a window's agreement is scored on an even sample of pairs and each answer's opening.
AGREEMENT_PAIRS = 60
AGREEMENT_WORDS = 100
AGREEMENT_LEAN_PAIRS = 20  # answered pairs before an agreement that only leans the canary's way passes


def is_json(text: str | None) -> bool:
    from qlift.quality.schema import parse_json_output

    return text is not None and parse_json_output(text.strip())[0]


def rouge_l(a: str, b: str) -> float:
    """ROUGE-L F1 over each answer's first AGREEMENT_WORDS tokens (qlift.quality.text: words, and CJK
    characters, so a Chinese answer's head is its first characters, not one space-less "word")."""
    from qlift.quality.text import rouge_l as rouge_l_text

    return rouge_l_text(a, b, max_tokens=AGREEMENT_WORDS)


def _prompt_key(request: dict[str, Any]) -> str:
    return repr(request.get("messages") or request.get("prompt"))


def check_json_valid(ev: ShadowEvidence, spec: ShadowSpec, a: AnalysisSpec, alpha: float) -> CheckResult:
    asked = [p for p in ev.pairs if p.wants_json and p.primary.ok and p.shadow.ok]
    r = CheckResult("json_valid", CheckStatus.INCONCLUSIVE, limit=spec.max_json_invalid_share)
    if not asked:
        r.status, r.detail = CheckStatus.SKIPPED, "no answered prompt asked for JSON"
        return r
    cbad = sum(1 for p in asked if not is_json(p.shadow.text))
    sbad = sum(1 for p in asked if not is_json(p.primary.text))
    n = len(asked)
    cshare, sshare = cbad / n, sbad / n
    r.canary, r.stable = cshare, sshare
    if cshare <= spec.max_json_invalid_share or cshare - sshare < a.min_share_increase:
        r.status = CheckStatus.PASS
        r.detail = f"not JSON where JSON was asked: canary {cbad}/{n}, stable {sbad}/{n}"
        return r
    # paired: the prompts where only the canary's answer is not JSON against those where only the stable's is
    worse = sum(1 for p in asked if not is_json(p.shadow.text) and is_json(p.primary.text))
    t = mcnemar_greater(worse, worse - (cbad - sbad))
    r.test, r.p_value = t.test, t.p_value
    r.status = CheckStatus.FAIL if t.p_value < alpha else CheckStatus.INCONCLUSIVE
    r.detail = (f"not JSON where JSON was asked: canary {cbad}/{n} vs stable {sbad}/{n} > "
                f"{spec.max_json_invalid_share}, only the canary's on {worse} prompts; {t.test} p={t.p_value:.3g}"
                + ("" if r.status == CheckStatus.FAIL else " (not significant)"))
    return r


def check_agreement(ev: ShadowEvidence, spec: ShadowSpec, a: AnalysisSpec, alpha: float,
                    pass_alpha: float | None = None) -> CheckResult:
    """``alpha`` (the window's per-check level, Bonferroni) decides a failure, as every check's does; showing a
    style is a test *for* the canary, outside the family that guards good canaries against false rollbacks: it
    runs at ``pass_alpha``, the window's own alpha (default: ``alpha``)."""
    both = [p for p in ev.pairs if p.primary.ok and p.shadow.ok and p.primary.text is not None
            and p.shadow.text is not None]
    r = CheckResult("agreement", CheckStatus.INCONCLUSIVE, limit=spec.min_agreement)
    if not both:
        no_text = ev.pairs and all(p.primary.text is None for p in ev.pairs)
        r.status = CheckStatus.SKIPPED if no_text else CheckStatus.INCONCLUSIVE
        r.detail = "no answered pairs with text yet"
        return r
    answered = len(both)
    both = sample(both, AGREEMENT_PAIRS)
    same = [rouge_l(p.primary.text or "", p.shadow.text or "") for p in both]
    prompts = [_prompt_key(p.request) for p in both]
    # The canary's answer against the stable's answers to other prompts: what agreement by chance is.
    other: list[float] = []
    for i, p in enumerate(both):
        for k in range(1, min(3, len(both))):
            j = (i + k) % len(both)
            if prompts[j] != prompts[i]:
                other.append(rouge_l(both[j].primary.text or "", p.shadow.text or ""))
    agreement = mean(same) or 0.0
    r.canary, r.stable = agreement, mean(other) if other else None
    described = (f"ROUGE-L canary vs stable on the same prompt {agreement:.3g} (mean of {len(same)} of {answered} "
                 f"pairs), on other "
                 f"prompts {'-' if r.stable is None else f'{r.stable:.3g}'}")
    if agreement >= spec.min_agreement:
        r.status, r.detail = CheckStatus.PASS, described + f" >= {spec.min_agreement}"
        return r
    shown = alpha if pass_alpha is None else pass_alpha
    if len(same) < a.min_samples or mann_whitney_greater([1.0] * len(same), [0.0] * len(other)).p_value >= shown:
        r.detail = described + f" (too few pairs for a test at alpha {shown:.2g} yet: not run)"
        return r
    t = mann_whitney_greater(same, other)
    r.test, r.p_value = t.test, t.p_value
    if t.p_value < shown:
        r.status = CheckStatus.PASS
        r.detail = described + f"; each answer fits its own prompt better than others' (p={t.p_value:.3g}): a style"
        return r
    mixed = mann_whitney_greater(other, same)
    if mixed.p_value < alpha:  # evidence against the canary, not only no evidence for it
        r.status, r.p_value = CheckStatus.FAIL, mixed.p_value
        r.detail = described + f"; answers fit other prompts' answers better than their own (p={mixed.p_value:.3g})"
        return r
    if answered >= max(spec.min_pairs, AGREEMENT_LEAN_PAIRS) and r.stable is not None and agreement > r.stable:
        # ROUGE-L is a weak signal between prose and JSON: the healthy examples/adapter still read p = 0.08 at
        # 39 pairs. Leaning to its own prompt, with no evidence against it, is no reason to hold it.
        r.status = CheckStatus.PASS
        r.detail = described + f"; leans to its own prompt (p={t.p_value:.3g}, not significant): no evidence against it"
        return r
    r.detail = described + (f"; not yet shown to fit its own prompt better than others' (p={t.p_value:.3g}): "
                            f"more pairs decide (a larger --shadow share or a longer --interval)")
    return r


def check_judge_model(j: JudgeResult | None, margin: float, alpha: float) -> CheckResult:
    """The judge model prefers the stable's answer by more than ``margin`` of the judged pairs, and a one-sided
    sign test over the pairs it did not call a tie agrees. No verdicts: inconclusive, never a failure.

    The decided quantity is ``loss - win`` (the stable's share of the judged pairs less the canary's), so that is
    the check's ``canary`` number against its ``limit`` (the margin), as the status line shows a check's number:
    not the canary's win share, which says nothing against a loss margin."""
    r = CheckResult("judge", CheckStatus.INCONCLUSIVE, limit=margin)
    if j is None or not j.judged:
        note = "; ".join(j.notes) if j is not None and j.notes else "no verdicts"
        r.detail = f"the judge gave no verdicts ({note}): inconclusive, never a failure"
        return r
    win, loss = j.share("wins") or 0.0, j.share("losses") or 0.0
    r.canary = loss - win
    ci = j.interval("losses")
    injected = f", {j.injections} decided on an answer addressing the evaluator" if j.injections else ""
    described = (f"judge {j.model}: canary better in {j.wins}, tie {j.ties} ({j.swapped_disagreed} by swapped order), "
                 f"stable better in {j.losses} of {j.judged} pairs{injected} (loss share {loss:.2f}, 95% CI "
                 f"{ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
    if loss - win <= margin:
        r.status, r.detail = CheckStatus.PASS, described + f"; loss - win {loss - win:.2f} <= {margin}"
        return r
    t = binomial_greater(j.losses, j.wins + j.losses, 0.5)
    r.test, r.p_value = "sign", t.p_value
    r.status = CheckStatus.FAIL if t.p_value < alpha else CheckStatus.INCONCLUSIVE
    r.detail = described + f"; loss - win {loss - win:.2f} > {margin}; sign test " \
                           f"p={t.p_value:.3g}" + ("" if r.status == CheckStatus.FAIL else " (not significant)")
    return r
