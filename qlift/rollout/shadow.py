"""The shadow judge: the canary answers copies of live prompts that only the stable answers for users.

``ShadowSource`` reads the qlift router's answer pairs (``GET /admin/shadow?since=SEQ``: the
request, the primary's answer and the shadow copy's answer) over one window; ``judge_shadow``
compares the two versions on the same prompts:

- the judge's own checks (``checks.CHECKS``: errors and answers that are not answers, latency,
  TTFT of streamed prompts, cut at max_tokens, going quiet, empty answers) on the two sides;
- ``json_valid``: where the prompt asked for JSON (``response_format`` json_object/json_schema, or
  the word JSON in it), the canary's answers that do not parse, against the stable's;
- ``agreement``: ROUGE-L F1 between the two answers to the same prompt (qlift.eval's scorer). A
  canary that changes style on purpose (short JSON for prose) agrees little word for word, but its
  answer still shares the prompt's particulars with the stable's answer to that prompt, more than
  with the stable's answers to other prompts. So the check passes on a mean agreement at or above
  ``min_agreement`` (near-identical answers), or on agreement with the same prompt's answer
  significantly above that with other prompts' answers (one-sided Mann-Whitney); it fails when
  neither holds over ``min_pairs``: an answer that fits any prompt as well as its own is no answer
  to it (templated JSON for another ticket agrees ~0.5 with every ticket's answer).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from qlift.quality.judge import JudgeResult, JudgeSettings, judge_pairs, parse_target, read_rubric, sample
from qlift.quality.registry import Answer as QualityAnswer
from qlift.quality.registry import message_text, user_text
from qlift.rollout.checks import CheckResult, CheckStatus, check_alpha, run_checks, window_spec
from qlift.rollout.evidence import VersionEvidence, unique
from qlift.rollout.judge import Action, Decision, Verdict, check_judge_model
from qlift.rollout.spec import AnalysisSpec, RolloutSpec, ShadowSpec
from qlift.rollout.stats import mann_whitney_greater, mean, proportion_greater
from qlift.router.metrics import token_latency

log = logging.getLogger(__name__)

_JSON_WORD = re.compile(r"\bjson\b", re.IGNORECASE)


@dataclass
class Answer:
    """One side of a pair, as the router records it."""

    backend: str
    status: int
    ok: bool
    latency_s: float
    reason: str | None = None
    ttft_s: float | None = None
    text: str | None = None
    finish_reason: str | None = None
    completion_tokens: int | None = None

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Answer:
        return cls(backend=str(rec.get("backend", "")), status=int(rec.get("status") or 0), ok=bool(rec.get("ok")),
                   latency_s=float(rec.get("latency_s") or 0.0), reason=rec.get("reason"),
                   ttft_s=rec.get("ttft_s"), text=rec.get("text"), finish_reason=rec.get("finish_reason"),
                   completion_tokens=rec.get("completion_tokens"))


@dataclass
class Pair:
    seq: int
    request: dict[str, Any]
    primary: Answer
    shadow: Answer
    path: str = "/v1/chat/completions"

    @property
    def stream(self) -> bool:
        return bool(self.request.get("stream"))

    @property
    def wants_json(self) -> bool:
        return wants_json(self.request)


@dataclass
class ShadowEvidence:
    """Paired answers of one shadow window: ``primary`` is the stable (what users got), ``shadow`` the canary."""

    stable: str
    canary: str
    pairs: list[Pair] = field(default_factory=list)
    started_at: float = 0.0
    ended_at: float = 0.0
    unpaired: int = 0  # copies dropped (over max_inflight) or never answered: not evidence either way
    notes: list[str] = field(default_factory=list)
    judged: JudgeResult | None = None  # the judge model's verdicts on a sample of the pairs (shadow.judge)

    def merged(self, later: ShadowEvidence) -> ShadowEvidence:
        judged = later.judged if self.judged is None else (
            self.judged if later.judged is None else self.judged.merged(later.judged))
        return ShadowEvidence(self.stable, self.canary, self.pairs + later.pairs, self.started_at, later.ended_at,
                              self.unpaired + later.unpaired, unique(self.notes + later.notes), judged)

    def side(self, which: str) -> VersionEvidence:
        """One side folded into the judge's evidence (TTFT from streamed prompts only)."""
        name = self.stable if which == "primary" else self.canary
        ev = VersionEvidence(name, errors=0, bad_answers=0, finishes=0, length_finishes=0, completions=0,
                             completion_tokens_sum=0.0, empty=0)
        answers: list[QualityAnswer] = []
        for p in self.pairs:
            a, other = (p.primary, p.shadow) if which == "primary" else (p.shadow, p.primary)
            if a.ok and a.text is not None:
                answers.append(QualityAnswer(p.request, a.text, other.text if other.ok else None))
            ev.requests += 1
            if not a.ok:
                ev.errors = (ev.errors or 0) + 1
                if a.status == 200:
                    ev.bad_answers = (ev.bad_answers or 0) + 1
                continue
            ev.latency_s.append(a.latency_s)
            if a.ttft_s is not None and p.stream:
                ev.ttft_s.append(float(a.ttft_s))
            if a.finish_reason is not None:
                ev.finishes = (ev.finishes or 0) + 1
                ev.length_finishes = (ev.length_finishes or 0) + int(a.finish_reason == "length")
            tokens = a.completion_tokens
            if tokens is None and a.text is not None and not a.text.strip():
                tokens = 0
            if tokens is not None:
                ev.completions = (ev.completions or 0) + 1
                ev.completion_tokens.append(float(tokens))
                ev.completion_tokens_sum = (ev.completion_tokens_sum or 0.0) + tokens
                if tokens == 0:
                    ev.empty = (ev.empty or 0) + 1
                else:
                    ev.token_latency_s.append(token_latency(a.latency_s, a.ttft_s, tokens, p.stream) or 0.0)
        ev.answers = answers or None
        return ev

    def summary(self) -> dict[str, Any]:
        both = [p for p in self.pairs if p.primary.ok and p.shadow.ok]
        out = {"pairs": len(self.pairs), "answered_pairs": len(both), "unpaired": self.unpaired,
               "json_prompts": sum(1 for p in self.pairs if p.wants_json),
               "stable": self.side("primary").summary(), "canary": self.side("shadow").summary()}
        if self.judged is not None:
            out["judge"] = self.judged.summary()
        return out


def wants_json(request: dict[str, Any]) -> bool:
    """The prompt asked for JSON: response_format json_object / json_schema, or it says JSON."""
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return True
    texts: list[str] = []
    if isinstance(request.get("prompt"), str):
        texts.append(request["prompt"])
    texts += [message_text(m.get("content")) for m in request.get("messages") or [] if isinstance(m, dict)]
    return any(_JSON_WORD.search(t) for t in texts)


def is_json(text: str | None) -> bool:
    from qlift.quality.schema import parse_json_output

    return text is not None and parse_json_output(text.strip())[0]


# ROUGE-L is quadratic in the answers' lengths (rouge-score: ~110 ms for two 300-word answers on a
# Zen 5 core), so a window's agreement is scored on an even sample of pairs and each answer's opening.
AGREEMENT_PAIRS = 60
AGREEMENT_WORDS = 100
AGREEMENT_LEAN_PAIRS = 20  # answered pairs before an agreement that only leans the canary's way passes


def rouge_l(a: str, b: str) -> float:
    from qlift.eval.metrics import _rouge

    def head(text: str) -> str:
        return " ".join(text.split()[:AGREEMENT_WORDS])

    return float(_rouge().score(head(a), head(b))["rougeL"].fmeasure)


# -- the shadow-only checks ---------------------------------------------------------------------


def check_json_valid(ev: ShadowEvidence, spec: ShadowSpec, a: AnalysisSpec) -> CheckResult:
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
    t = proportion_greater(cbad, n, sbad, n)
    r.test, r.p_value = t.test, t.p_value
    r.status = CheckStatus.FAIL if t.p_value < check_alpha(a) else CheckStatus.INCONCLUSIVE
    r.detail = (f"not JSON where JSON was asked: canary {cbad}/{n} vs stable {sbad}/{n} > "
                f"{spec.max_json_invalid_share}; {t.test} p={t.p_value:.3g}"
                + ("" if r.status == CheckStatus.FAIL else " (not significant)"))
    return r


def check_agreement(ev: ShadowEvidence, spec: ShadowSpec, a: AnalysisSpec, pass_alpha: float | None = None
                    ) -> CheckResult:
    """``a``'s per-check alpha (Bonferroni) decides a failure, as every check's does; showing a style is a test
    *for* the canary, outside the family that guards good canaries against false rollbacks: it runs at
    ``pass_alpha``, the window's own alpha (default: ``a``'s per-check one)."""
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
    alpha = check_alpha(a)
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


def judge_window(ev: ShadowEvidence, spec: ShadowSpec) -> JudgeResult | None:
    """The judge model's verdicts on an even sample of the window's answered pairs (None without shadow.judge)."""
    if spec.judge is None:
        return None
    url, model = parse_target(spec.judge, flag="shadow.judge")
    rubric, name = read_rubric(spec.judge_rubric)
    settings = JudgeSettings(url, model, rubric, name, spec.judge_pairs, spec.judge_concurrency, spec.judge_timeout_s,
                             spec.judge_deadline_s)
    triples = [(user_text(p.request), p.primary.text or "", p.shadow.text or "") for p in ev.pairs
               if p.primary.ok and p.shadow.ok and p.primary.text is not None and p.shadow.text is not None]
    return judge_pairs(triples, settings)


def check_judge(ev: ShadowEvidence, spec: ShadowSpec, a: AnalysisSpec) -> CheckResult:
    return check_judge_model(ev.judged, spec.max_judge_loss_margin, a)


def _prompt_key(request: dict[str, Any]) -> str:
    return repr(request.get("messages") or request.get("prompt"))


def judge_shadow(ev: ShadowEvidence, spec: ShadowSpec | RolloutSpec, analysis: AnalysisSpec | None = None
                 ) -> Decision:
    """The canary's shadow answers against the stable's, pair by pair: ``rollback`` on any failing check,
    ``hold`` (verdict ``insufficient``) below ``min_pairs`` answered pairs, else ``advance`` when all pass.
    ``spec`` is the shadow section, or the whole rollout spec (its shadow and analysis sections)."""
    if isinstance(spec, RolloutSpec):
        analysis = analysis or spec.analysis
        spec = spec.shadow or ShadowSpec.model_validate({})
    base = (analysis or AnalysisSpec.model_validate({})).model_copy(update={"min_requests": spec.min_pairs})
    stable, canary = ev.side("primary"), ev.side("shadow")
    # two more tested checks (json_valid, agreement) share the window's family-wise alpha (Bonferroni)
    extra = 3 if spec.judge is not None else 2
    checks = [c for c in run_checks(canary, stable, base, extra=extra) if c.name != "tpot"]
    a = window_spec(canary, stable, base, extra=extra)
    for c in checks:
        if c.name == "canary_requests":
            c.detail = c.detail.replace("requests", "shadow pairs").replace("min_shadow pairs", "min_pairs")
    checks += [check_json_valid(ev, spec, a), check_agreement(ev, spec, a, pass_alpha=base.alpha)]
    if spec.judge is not None:
        checks.append(check_judge(ev, spec, a))
    failed = [c for c in checks if c.status == CheckStatus.FAIL]
    if failed:
        return Decision(Action.ROLLBACK, "shadow: " + "; ".join(f"{c.name}: {c.detail}" for c in failed), checks,
                        Verdict.FAIL)
    if len(ev.pairs) < spec.min_pairs:
        return Decision(Action.HOLD, f"insufficient: {len(ev.pairs)} shadow pairs < min_pairs {spec.min_pairs} "
                                     f"(raise the shadow percent or the interval)", checks, Verdict.INSUFFICIENT)
    unsure = [c for c in checks if c.status == CheckStatus.INCONCLUSIVE]
    if unsure:
        return Decision(Action.HOLD, "shadow inconclusive: " + "; ".join(f"{c.name}: {c.detail}" for c in unsure),
                        checks)
    return Decision(Action.ADVANCE, f"shadow: every check passed over {len(ev.pairs)} pairs", checks, Verdict.PASS)


# -- the router's pairs ------------------------------------------------------------------------


class ShadowSource:
    """The qlift router's shadow pairs over one window: ``begin()``, then ``collect()``.

    ``start(version, percent, max_inflight)`` / ``stop()`` turn the router's mirroring on and off
    (``PUT`` / ``DELETE /admin/shadow``).
    """

    name = "router-shadow"

    def __init__(self, router_url: str, token: str | None, *, stable: str = "", canary: str = "") -> None:
        from qlift.router.client import RouterClient

        self.client = RouterClient(router_url, token)
        self.stable, self.canary = stable, canary
        self.cursor = 0
        self.started = 0.0
        self.pending: list[Pair] = []

    def start(self, version: str, percent: float, max_inflight: int, *, partner: str | None = None
              ) -> dict[str, Any]:
        """Mirror ``percent`` of the requests others serve to ``version``; with ``partner``, of the requests
        either serves to the other (the split phase's sample for the judge model)."""
        self.canary = version
        body: dict[str, Any] = {"version": version, "percent": percent, "max_inflight": max_inflight}
        return dict(self.client._call("PUT", "/admin/shadow", json=body | ({"partner": partner} if partner else {})))

    def stop(self) -> None:
        self.client._call("DELETE", "/admin/shadow")

    def _fetch(self) -> list[Pair]:
        body = self.client._call("GET", "/admin/shadow", params={"since": self.cursor})
        pairs = []
        for raw in body.get("pairs", []):
            if raw.get("primary") is None or raw.get("shadow") is None:
                continue
            pairs.append(Pair(int(raw["seq"]), dict(raw.get("request") or {}), Answer.from_record(raw["primary"]),
                              Answer.from_record(raw["shadow"]), str(raw.get("path", ""))))
        self.cursor = int(body.get("next", self.cursor))
        return pairs

    def begin(self) -> None:
        self.started = time.time()
        self._fetch()  # everything before this window is skipped
        self.pending = []

    def peek(self) -> ShadowEvidence:
        self.pending += self._fetch()
        return self._evidence(list(self.pending))

    def collect(self) -> ShadowEvidence:
        self.pending += self._fetch()
        ev = self._evidence(self.pending)
        self.pending = []
        self.started = ev.ended_at
        return ev

    def _evidence(self, pairs: list[Pair]) -> ShadowEvidence:
        # a split window's pair whose user got the canary's answer: its copy is the stable's
        pairs = [Pair(p.seq, p.request, p.shadow, p.primary, p.path) if self.canary and p.primary.backend ==
                 self.canary else p for p in pairs]
        stable = self.stable or (pairs[0].primary.backend if pairs else "")
        mine = [p for p in pairs if not self.canary or p.shadow.backend in ("", self.canary)]
        return ShadowEvidence(stable, self.canary, mine, self.started, time.time())
