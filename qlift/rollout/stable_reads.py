"""The stable reads the canary: a window's answers, both versions', scored under the stable model.

A check written for one named failure misses the disguises nobody listed (misdecoded text, another language,
template debris, answers off the model's distribution). Each of them makes an answer unlikely under the stable
model given its own request. So where the stable is a vLLM server, each window sends an even sample of both
versions' answers (``analysis.stable_reads_samples`` a version; in a shadow window, pairs) to it for a prefill
(qlift.quality.scorer): per answer its mean negative log-likelihood per token and the share of its tokens under
log-probability -12. The ``stable_reads`` check (read_checks.py) compares the canary's with the stable's own.

``StableReader`` is the controller's: it finds the stable's server (``analysis.stable_reads``: auto, the data
plane's stable backend and its served model; or URL#MODEL), asks once whether it is vLLM (its /v1/models says
``owned_by: vllm``), and scores each window within ``stable_reads_deadline_s``. What it found is ``StableReads``,
carried in the window's evidence (added up over held windows, journaled with them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qlift.quality.judge import parse_target, sample
from qlift.quality.language import prompt_script
from qlift.quality.registry import EXAMPLE_CHARS, Answer, example_text, user_text
from qlift.quality.scorer import ScorerSettings, messages_of, score_answers, vllm_models

if TYPE_CHECKING:
    from qlift.rollout.dataplane import DataPlane
    from qlift.rollout.evidence import Evidence
    from qlift.rollout.shadow import ShadowEvidence
    from qlift.rollout.spec import RolloutSpec

log = logging.getLogger(__name__)

CANARY, STABLE = "canary", "stable"


@dataclass(frozen=True)
class ReadAnswer:
    """One answer as the stable model read it; the canary's keep an excerpt for a person to read."""

    side: str  # CANARY or STABLE
    nll: float  # mean negative log-likelihood per answer token, nats
    low_share: float  # share of its tokens under the scorer's low log-probability
    tokens: int
    script: str | None  # the prompt's script (qlift.quality.language.prompt_script)
    pair: int | None = None  # a shadow pair's seq: the same prompt's answer on the other side has it too
    prompt: str | None = None
    text: str | None = None


@dataclass
class StableReads:
    """One window's (or held windows') answers read by the stable model; ``skipped``: why none could be."""

    model: str = ""
    answers: list[ReadAnswer] = field(default_factory=list)
    sampled: int = 0  # answers sent to be scored
    calls: int = 0
    seconds: float = 0.0
    prompt_tokens: int = 0  # tokens prefilled on the stable's server
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def unscored(self) -> int:
        return self.sampled - len(self.answers)

    def side(self, which: str) -> list[ReadAnswer]:
        return [x for x in self.answers if x.side == which]

    def pairs(self) -> list[tuple[ReadAnswer, ReadAnswer]]:
        """(canary, stable) answers of the pairs whose both answers were scored."""
        stable = {x.pair: x for x in self.side(STABLE) if x.pair is not None}
        return [(c, stable[c.pair]) for c in self.side(CANARY) if c.pair in stable]

    def merged(self, later: StableReads) -> StableReads:
        answers = self.answers + later.answers
        return StableReads(later.model or self.model, answers, self.sampled + later.sampled, self.calls + later.calls,
                           self.seconds + later.seconds, self.prompt_tokens + later.prompt_tokens,
                           list(dict.fromkeys(self.notes + later.notes)),
                           None if answers else later.skipped or self.skipped)

    def summary(self) -> dict[str, Any]:
        return {"model": self.model, "scored": len(self.answers), "unscored": self.unscored, "calls": self.calls,
                "seconds": round(self.seconds, 3), "prompt_tokens": self.prompt_tokens, "skipped": self.skipped}

    @classmethod
    def load(cls, d: dict[str, Any] | None) -> StableReads | None:
        """From the journal's JSON (``to_jsonable`` of one)."""
        if d is None:
            return None
        return cls(**{**d, "answers": [ReadAnswer(**x) for x in d.get("answers") or []]})


def merged_reads(held: StableReads | None, later: StableReads | None) -> StableReads | None:
    """Held windows' reads followed by the next window's (either may be missing)."""
    return later if held is None else held if later is None else held.merged(later)


def _read(side: str, a: Answer, pair: int | None) -> tuple[list[dict[str, str]], str, dict[str, Any]]:
    """(messages, answer, what ReadAnswer keeps of it) for one answer to score."""
    keep: dict[str, Any] = {"side": side, "script": prompt_script(a.prompt), "pair": pair}
    if side == CANARY:
        keep |= {"prompt": example_text(user_text(a.request), EXAMPLE_CHARS["prompt"]),
                 "text": example_text(a.text, EXAMPLE_CHARS["answer"])}
    return messages_of(a.request), a.text, keep


@dataclass(frozen=True)
class NoTarget:
    """Why no server reads this window's answers (the check is skipped, out of the window's family)."""

    why: str


class StableReader:
    """Scores each window's answers under the stable model, where the stable is a vLLM server."""

    def __init__(self, spec: RolloutSpec, plane: DataPlane) -> None:
        self.spec, self.plane = spec, plane
        self.a = spec.analysis
        self._vllm: dict[str, list[str]] = {}  # URL -> the models its vLLM lists (asked once a rollout)
        self._said: set[str] = set()  # why the check was skipped, logged once each

    def _named(self) -> tuple[str, str] | NoTarget:
        """(URL, served model or '') of the stable, as the spec or the data plane names it."""
        from qlift.errors import QliftError
        from qlift.rollout.dataplane import NamesModels

        if self.a.stable_reads != "auto":
            return parse_target(self.a.stable_reads, flag="analysis.stable_reads")
        try:
            url = self.plane.backend_urls().get(self.spec.stable, "")
            named = self.plane.backend_models() if isinstance(self.plane, NamesModels) else {}
        except QliftError as exc:
            return NoTarget(f"the data plane did not say where the stable runs ({exc.one_line()})")
        if not url:
            return NoTarget("the data plane does not say where the stable's server is (set analysis.stable_reads "
                            "URL#MODEL)")
        if "***@" in url:
            return NoTarget("the stable's URL carries credentials the router does not show (set "
                            "analysis.stable_reads URL#MODEL)")
        url, _, fragment = url.partition("#")
        return url.rstrip("/").removesuffix("/v1"), named.get(self.spec.stable) or self.spec.models.get(
            self.spec.stable) or fragment

    def _target(self) -> tuple[str, str] | NoTarget:
        """(URL, model) of the stable's vLLM server, or why there is none. Raises nothing."""
        named = self._named()
        if isinstance(named, NoTarget):
            return named
        url, model = named
        if url not in self._vllm:
            listed = vllm_models(url, timeout_s=self.a.stable_reads_timeout_s)
            if listed is None:  # asked again next window
                return NoTarget(f"the stable's server {url} did not answer /v1/models: cannot tell whether it is "
                                "a vLLM server")
            self._vllm[url] = listed
        listed = self._vllm[url]
        model = model or (listed[0] if len(listed) == 1 else "")
        if model not in listed:
            return NoTarget(f"the stable's server {url} is not a vLLM server of {model or 'one model'} (its "
                            "/v1/models): nothing reads the answers")
        return url, model

    def _score(self, items: list[tuple[list[dict[str, str]], str, dict[str, Any]]]) -> StableReads:
        target = self._target()
        if isinstance(target, NoTarget):
            return self._skipped(target.why)
        url, model = target
        a = self.a
        settings = ScorerSettings(url, model, a.stable_reads_concurrency, a.stable_reads_timeout_s,
                                  a.stable_reads_deadline_s)
        run = score_answers([(m, t) for m, t, _ in items], settings)
        answers = [ReadAnswer(nll=s.nll, low_share=s.low_share, tokens=s.tokens, **keep)
                   for (_, _, keep), s in zip(items, run.scores, strict=True) if s is not None]
        if not answers and not run.down:  # it answered and scored nothing: no verdict to wait for
            if run.cannot_read is not None:
                self._vllm[url] = []  # not asked again this rollout
            return self._skipped(f"the stable's server {url} scored none of the answers ({'; '.join(run.notes)})")
        # scored some, or failed on some while down or slow: those are unscored, never bad
        return StableReads(model, answers, len(items), run.calls, run.seconds, run.prompt_tokens, run.notes)

    def _skipped(self, why: str) -> StableReads:
        if why not in self._said:
            self._said.add(why)
            log.info("stable_reads skipped: %s", why)
        return StableReads(skipped=why)

    def read_split(self, ev: Evidence) -> StableReads:
        """An even sample of each version's answers in a split window (the router's request log)."""
        if ev.canary.answers is None or ev.stable.answers is None:
            return StableReads(skipped="the evidence source sees no answers (the qlift router's request log does)")
        n = self.a.stable_reads_samples
        canary = [_read(CANARY, x, None) for x in sample([x for x in ev.canary.answers if x.text.strip()], n)]
        stable = [_read(STABLE, x, None) for x in sample([x for x in ev.stable.answers if x.text.strip()], n)]
        if not canary or not stable:
            return StableReads(skipped="no answers of " + ("the canary" if not canary else "the stable") + " yet")
        # interleaved: a deadline cuts both versions' samples alike
        items = [x for pair in zip(canary, stable, strict=False) for x in pair]
        return self._score(items + canary[len(stable):] + stable[len(canary):])

    def read_shadow(self, ev: ShadowEvidence) -> StableReads:
        """An even sample of a shadow window's answered pairs, both answers of each."""
        both = [p for p in ev.pairs if p.primary.ok and p.shadow.ok and (p.primary.text or "").strip()
                and (p.shadow.text or "").strip()]
        items = []
        for p in sample(both, self.a.stable_reads_samples):
            items += [_read(CANARY, Answer(p.request, p.shadow.text or ""), p.seq),
                      _read(STABLE, Answer(p.request, p.primary.text or ""), p.seq)]
        return self._score(items) if items else StableReads(skipped="no answered pairs yet")


def make_reader(spec: RolloutSpec, plane: DataPlane) -> StableReader | None:
    """The rollout's reader, unless ``analysis.stable_reads`` is off."""
    return None if spec.analysis.stable_reads == "off" else StableReader(spec, plane)
