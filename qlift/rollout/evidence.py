"""Evidence: what each version did over one analysis window, whatever the source.

Sources fill what they can: the router's request log gives per-request samples (so the
judge can run rank tests); Prometheus gives counts and quantiles only; vLLM's /metrics adds
the engine's own view (TTFT, time per output token, queue depth, preemptions).
A field left ``None`` means "this source cannot tell", never zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from qlift.quality.judge import JudgeResult
from qlift.quality.registry import Answer
from qlift.rollout.planes import SourceName
from qlift.rollout.stable_reads import StableReads, merged_reads
from qlift.rollout.stats import mean, quantile
from qlift.router.metrics import token_latency
from qlift.router.wire import RequestRecord


@dataclass
class VersionEvidence:
    version: str
    requests: int = 0  # upstream attempts in the window, failed ones included
    errors: int | None = None  # 5xx, connection errors and answers that are not answers, replayed ones included
    bad_answers: int | None = None  # ... of which HTTP 200s whose body is no completion (router: reason)
    latency_s: list[float] = field(default_factory=list)  # e2e of successful attempts
    ttft_s: list[float] = field(default_factory=list)  # time to first byte of successful *streamed* attempts
    completion_tokens: list[float] = field(default_factory=list)  # per successful request
    # seconds per completion token after the first byte (e2e / tokens without one): speed, not verbosity
    token_latency_s: list[float] = field(default_factory=list)
    finishes: int | None = None  # answers with a known finish_reason
    length_finishes: int | None = None  # ... of which finish_reason=length
    completions: int | None = None  # answers with a known completion token count
    completion_tokens_sum: float | None = None
    empty: int | None = None  # answers with zero completion tokens
    quantiles: dict[str, float | None] = field(default_factory=dict)  # latency_p50 .. ttft_p95
    vllm: dict[str, float | None] = field(default_factory=dict)  # from the backend's /metrics
    # the answers' texts with their requests (qlift.quality judges them); None: the source cannot see answers
    answers: list[Answer] | None = None
    sessions: int | None = None  # requests that carried a session key (sticky to a version); None: cannot tell
    down: str | None = None  # the router keeps it out of rotation at the window's end: its reason
    down_seen: str | None = None  # ... at some check during the window (it may be back by the end)

    @property
    def error_rate(self) -> float | None:
        if self.errors is None or self.requests == 0:
            return None
        return self.errors / self.requests

    @property
    def length_share(self) -> float | None:
        if not self.finishes or self.length_finishes is None:
            return None
        return self.length_finishes / self.finishes

    @property
    def empty_share(self) -> float | None:
        if not self.completions or self.empty is None:
            return None
        return self.empty / self.completions

    @property
    def mean_completion_tokens(self) -> float | None:
        if self.completion_tokens:
            return mean(self.completion_tokens)
        if self.completions and self.completion_tokens_sum is not None:
            return self.completion_tokens_sum / self.completions
        return None

    def latency_quantile(self, kind: str, q: float) -> float | None:
        """``kind`` latency or ttft: from samples when there are any, else from the source's quantiles."""
        samples = {"latency": self.latency_s, "ttft": self.ttft_s, "token_latency": self.token_latency_s}[kind]
        if samples:
            return quantile(samples, q)
        return self.quantiles.get(f"{kind}_p{round(q * 100)}")

    def merged(self, later: VersionEvidence) -> VersionEvidence:
        """This window followed by ``later``: counts and samples add up; quantiles and engine
        numbers (which cannot be added) are the later window's."""

        def add(a: float | None, b: float | None) -> Any:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return VersionEvidence(
            self.version, requests=self.requests + later.requests, errors=add(self.errors, later.errors),
            bad_answers=add(self.bad_answers, later.bad_answers),
            latency_s=self.latency_s + later.latency_s, ttft_s=self.ttft_s + later.ttft_s,
            completion_tokens=self.completion_tokens + later.completion_tokens,
            token_latency_s=self.token_latency_s + later.token_latency_s,
            finishes=add(self.finishes, later.finishes),
            length_finishes=add(self.length_finishes, later.length_finishes),
            completions=add(self.completions, later.completions),
            completion_tokens_sum=add(self.completion_tokens_sum, later.completion_tokens_sum),
            empty=add(self.empty, later.empty), quantiles=dict(later.quantiles or self.quantiles),
            vllm=dict(later.vllm or self.vllm),
            answers=None if self.answers is None and later.answers is None else
            (self.answers or []) + (later.answers or []),
            sessions=add(self.sessions, later.sessions), down=later.down,
            down_seen=later.down_seen or later.down or self.down_seen or self.down)

    def summary(self) -> dict[str, Any]:
        """The numbers the journal and `status` keep (samples reduced to quantiles)."""
        out: dict[str, Any] = {
            "version": self.version, "requests": self.requests, "errors": self.errors, "bad_answers": self.bad_answers,
            "error_rate": self.error_rate, "length_share": self.length_share, "empty_share": self.empty_share,
            "mean_completion_tokens": self.mean_completion_tokens,
            "latency_samples": len(self.latency_s), "ttft_samples": len(self.ttft_s),
        }
        out["token_latency_p50"] = self.latency_quantile("token_latency", 0.5)
        for kind in ("latency", "ttft"):
            for q in (0.5, 0.95, 0.99):
                out[f"{kind}_p{round(q * 100)}"] = self.latency_quantile(kind, q)
        out.update({k: v for k, v in self.quantiles.items() if k not in out})
        if self.vllm:
            out["vllm"] = dict(self.vllm)
        if self.answers is not None:
            out["answers"] = len(self.answers)
        if self.sessions is not None:
            out["sessions"] = self.sessions
        if self.down is not None:
            out["down"] = self.down
        return out


NO_PRIMARY: str = SourceName.NONE  # the source of a plane without request counts (vLLM /metrics at most)


@dataclass
class Evidence:
    """Both versions over the same window; ``error``: why the evidence source gave nothing this window."""

    stable: VersionEvidence
    canary: VersionEvidence
    started_at: float
    ended_at: float
    source: str  # a SourceName
    notes: list[str] = field(default_factory=list)
    windows: int = 1  # >1: held windows of this step carried over into this one
    weight: int | None = None  # the canary's planned percent in this window (the controller fills it in)
    judged: JudgeResult | None = None  # the judge model's verdicts on this window's sampled pairs
    judge_margin: float = 0.1  # shadow.max_judge_loss_margin, with ``judged``
    error: str | None = None  # the evidence source failed: no measurement (judged Verdict.ERROR)
    reads: StableReads | None = None  # both versions' sampled answers read by the stable model (stable_reads.py)

    def merged(self, later: Evidence) -> Evidence:
        judged = later.judged if self.judged is None else (
            self.judged if later.judged is None else self.judged.merged(later.judged))
        return Evidence(self.stable.merged(later.stable), self.canary.merged(later.canary), self.started_at,
                        later.ended_at, later.source, unique(self.notes + later.notes), self.windows + later.windows,
                        later.weight if later.weight is not None else self.weight, judged, later.judge_margin,
                        later.error, merged_reads(self.reads, later.reads))


def unique(notes: list[str]) -> list[str]:
    """Notes in order, each once: a note every window carries (one server for both versions) is said once
    in the cumulative evidence of held windows, not once a window."""
    return list(dict.fromkeys(notes))


# The router's failure reasons for an HTTP 200 whose body is no completion (qlift.router).
BAD_ANSWER_REASONS = frozenset({"bad_body", "no_choices", "error_object", "no_done", "error_event"})


@dataclass(frozen=True)
class Observation:
    """One attempt of one version as a window saw it, whatever the window's kind (a request of a split window,
    one side of a shadow pair): what ``EvidenceCounter`` counts."""

    ok: bool
    latency_s: float | None  # None: the source could not tell (an nginx log line without it)
    stream: bool
    ttft_s: float | None = None  # the first byte's time (TTFT where ``stream``)
    finish_reason: str | None = None
    completion_tokens: int | None = None
    bad_answer: bool = False  # failed: an HTTP 200 whose body is no completion
    session: bool = False  # it carried a session key (sticky to a version)
    answer: Answer | None = None  # its text with its request, where the source captured it


class EvidenceCounter:
    """One version's evidence over a window, counted one ``Observation`` at a time: the one set of counting
    rules that every window kind feeds (split, shadow and bake windows) and the judge reads. ``sessions``: the
    source can tell session keys (else ``VersionEvidence.sessions`` stays None: cannot tell)."""

    def __init__(self, version: str, *, sessions: bool = False, bodies: bool = True) -> None:
        """``bodies``: the source sees answers' bodies (finish reasons, token counts, garbage 200s); without
        them (an access log) those figures stay None: cannot tell, not zero."""
        told = 0 if bodies else None
        self.ev = VersionEvidence(version, errors=0, bad_answers=told, finishes=told, length_finishes=told,
                                  completions=told, completion_tokens_sum=None if told is None else 0.0, empty=told,
                                  sessions=0 if sessions else None)
        self.answers: list[Answer] = []

    def add(self, o: Observation) -> None:
        """A failed attempt counts as an error (and a bad answer where it answered garbage), without latency;
        TTFT counts for streamed attempts only (a non-streamed one's first byte is its whole answer)."""
        ev = self.ev
        if o.answer is not None and o.ok:
            self.answers.append(o.answer)
        ev.requests += 1
        if o.session:
            ev.sessions = (ev.sessions or 0) + 1
        if not o.ok:
            ev.errors = (ev.errors or 0) + 1
            if o.bad_answer:
                ev.bad_answers = (ev.bad_answers or 0) + 1
            return
        if o.latency_s is None:
            return
        ev.latency_s.append(float(o.latency_s))
        if o.ttft_s is not None and o.stream:
            ev.ttft_s.append(float(o.ttft_s))
        if o.finish_reason is not None:
            ev.finishes = (ev.finishes or 0) + 1
            if o.finish_reason == "length":
                ev.length_finishes = (ev.length_finishes or 0) + 1
        tokens = o.completion_tokens
        if tokens is None:
            return
        ev.completion_tokens.append(float(tokens))
        ev.completions = (ev.completions or 0) + 1
        ev.completion_tokens_sum = (ev.completion_tokens_sum or 0.0) + tokens
        per_token = token_latency(float(o.latency_s), None if o.ttft_s is None else float(o.ttft_s), tokens, o.stream)
        if per_token is not None:  # None: zero tokens
            ev.token_latency_s.append(per_token)
        if tokens == 0:
            ev.empty = (ev.empty or 0) + 1

    def evidence(self) -> VersionEvidence:
        self.ev.answers = self.answers or None  # none captured: the source does not see answers (or none succeeded)
        return self.ev


def from_request_records(version: str, records: Iterable[RequestRecord]) -> VersionEvidence:
    """Fold the router's per-attempt records of one backend into evidence.

    A client that went away is nobody's error and has no meaningful latency: skipped. A failed
    record whose reason says the 200 answer was garbage also counts in ``bad_answers``.
    """
    counter = EvidenceCounter(version, sessions=True)
    for r in records:
        if r.client_disconnected:
            continue
        sample = r.answer
        counter.add(Observation(
            r.ok, r.latency_s, r.stream, r.ttfb_s, r.finish_reason, r.completion_tokens,
            bad_answer=r.reason in BAD_ANSWER_REASONS, session=r.session,
            answer=None if sample is None else Answer(
                sample.request(), sample.text, finish_reason=r.finish_reason, tool_calls=sample.calls(),
                completion_tokens=r.completion_tokens)))
    return counter.evidence()
