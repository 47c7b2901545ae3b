"""Shadow evidence: the canary answers copies of live prompts that only the stable answers for users.

``ShadowSource`` reads the qlift router's answer pairs (``GET /admin/shadow?since=SEQ``: the
request, the primary's answer and the shadow copy's answer) over one window into ``ShadowEvidence``.
The one judge (judge.py) compares the two versions on the same prompts: the registry's checks
(``checks.CHECKS``: errors and answers that are not answers, latency, TTFT of streamed prompts, cut at
max_tokens, going quiet, empty answers, the answer checks) on the two sides, and the checks of the pairs
themselves (pair_checks.py: ``json_valid``, ``agreement``, and the judge model's ``judge``, whose verdicts
``judge_window`` asks for).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from qlift.quality.judge import JudgeResult, JudgeSettings, judge_pairs, parse_target, read_rubric
from qlift.quality.registry import Answer as QualityAnswer
from qlift.quality.registry import user_text
from qlift.quality.toolcalls import ToolCall
from qlift.rollout.evidence import EvidenceCounter, Observation, VersionEvidence, unique
from qlift.rollout.spec import ShadowSpec
from qlift.rollout.stable_reads import StableReads, merged_reads
from qlift.router.wire import ShadowAnswer, ShadowBatch

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
    tool_calls: tuple[ToolCall, ...] = ()  # (name, arguments) each

    @classmethod
    def from_wire(cls, side: ShadowAnswer) -> Answer:
        return cls(backend=side.backend, status=side.status, ok=side.ok, latency_s=side.latency_s, reason=side.reason,
                   ttft_s=side.ttft_s, text=side.text, finish_reason=side.finish_reason,
                   completion_tokens=side.completion_tokens, tool_calls=side.calls())

    def observed(self, pair: Pair, other: Answer) -> Observation:
        """This side of ``pair`` as the evidence counter reads it. A copy's text is always captured, so a blank
        one without a token count is known to be empty; a failed side that answered 200 answered garbage."""
        tokens = self.completion_tokens
        if tokens is None and self.text is not None and not self.text.strip():
            tokens = 0
        answer = None if self.text is None else QualityAnswer(pair.request, self.text,
                                                              other.text if other.ok else None,
                                                              finish_reason=self.finish_reason,
                                                              tool_calls=self.tool_calls, completion_tokens=tokens)
        return Observation(self.ok, self.latency_s, pair.stream, self.ttft_s, self.finish_reason, tokens,
                           bad_answer=self.status == 200, answer=answer)

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Answer:
        """From one side of a pair as ``GET /admin/shadow`` sends it (recorded pairs)."""
        return cls.from_wire(ShadowAnswer.model_validate(rec))


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
    error: str | None = None  # the router's shadow ring could not be read: no measurement (Verdict.ERROR)
    reads: StableReads | None = None  # both answers of sampled pairs read by the stable model (stable_reads.py)

    def merged(self, later: ShadowEvidence) -> ShadowEvidence:
        judged = later.judged if self.judged is None else (
            self.judged if later.judged is None else self.judged.merged(later.judged))
        return ShadowEvidence(self.stable, self.canary, self.pairs + later.pairs, self.started_at, later.ended_at,
                              self.unpaired + later.unpaired, unique(self.notes + later.notes), judged, later.error,
                              merged_reads(self.reads, later.reads))

    def side(self, which: str) -> VersionEvidence:
        """One side folded into the judge's evidence, by the counter every window kind feeds."""
        counter = EvidenceCounter(self.stable if which == "primary" else self.canary)
        for p in self.pairs:
            a, other = (p.primary, p.shadow) if which == "primary" else (p.shadow, p.primary)
            counter.add(a.observed(p, other))
        return counter.evidence()

    def summary(self) -> dict[str, Any]:
        both = [p for p in self.pairs if p.primary.ok and p.shadow.ok]
        out = {"pairs": len(self.pairs), "answered_pairs": len(both), "unpaired": self.unpaired,
               "json_prompts": sum(1 for p in self.pairs if p.wants_json),
               "stable": self.side("primary").summary(), "canary": self.side("shadow").summary()}
        if self.judged is not None:
            out["judge"] = self.judged.summary()
        if self.reads is not None:
            out["stable_reads"] = self.reads.summary()
        return out


def wants_json(request: dict[str, Any]) -> bool:
    """The request asked for JSON, as the ``json_invalid`` answer check reads it (``qlift.quality.schema``):
    response_format json_object / json_schema, JSON named in the system prompt, or asked for by the user."""
    from qlift.quality.registry import system_text, user_text
    from qlift.quality.schema import asks_json

    return asks_json(request, system_text(request), user_text(request))


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


# -- the router's pairs ------------------------------------------------------------------------


class ShadowSource:
    """The qlift router's shadow pairs over one window: ``begin()``, then ``collect()``.

    ``start(version, percent, max_inflight)`` / ``stop()`` turn the router's mirroring on and off
    (``PUT`` / ``DELETE /admin/shadow``), through the router client's public methods; the pairs come as
    ``qlift.router.wire.ShadowBatch``.
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
        either serves to the other (the split phase's sample for the judge model). The router's state, as sent."""
        self.canary = version
        return self.client.set_shadow(version, percent, max_inflight, partner=partner).model_dump()

    def stop(self) -> None:
        self.client.clear_shadow()

    def _fetch(self) -> list[Pair]:
        batch: ShadowBatch = self.client.shadow_pairs(since=self.cursor)
        self.cursor = batch.next
        return [Pair(p.seq, p.request, Answer.from_wire(p.primary), Answer.from_wire(p.shadow), p.path)
                for p in batch.pairs]

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
