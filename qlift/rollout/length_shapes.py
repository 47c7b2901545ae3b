"""Answer lengths compared like for like: each canary answer against the stable's answers to requests of the
same shape (the prompt's script, the system prompt, the response format, the tools).

A window's requests are a sample of the traffic, and a small one early in a rollout: 12 canary answers of a
desk whose JSON answers are 5 tokens and whose prose answers 50 can hold mostly JSON by chance, and the pooled
means then read a healthy canary as one that "goes quiet". Compared by shape, the canary's answers are held to
the stable's mean for their own kind of request, whatever the mix. Where the answers do not tell shapes (a
source without answers, or one shape only), the pooled means are the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean

from qlift.quality.language import prompt_script
from qlift.quality.registry import PROMPT_CHARS, Answer, request_parts
from qlift.rollout.evidence import VersionEvidence

MIN_STABLE_ANSWERS = 2  # a shape the stable answered fewer times sets no expected length
SYSTEM_CHARS = 200  # a system prompt's opening names the application; per-user details further on do not split it

Shape = tuple[str, str, str, str]


def request_shape(a: Answer) -> Shape:
    user, system, fmt, tools = request_parts(a.request)
    return prompt_script(user[:PROMPT_CHARS]) or "", system[:SYSTEM_CHARS], fmt, tools


@dataclass(frozen=True)
class ShapeMatched:
    """The canary's answers that have a stable shape, and what the stable answered to that shape."""

    observed: float  # the canary's mean completion tokens over its matched answers
    expected: float  # the stable's mean for the same answers' shapes
    canary: list[float]  # each matched canary answer's tokens over its shape's stable mean
    stable: list[float]  # each stable answer's tokens over its own shape's mean (the rank test's other side)
    shapes: int  # the shapes the matched canary answers fall in

    def describe(self) -> str:
        return f"on the same request shapes ({len(self.canary)} answers, {self.shapes} shapes)"


def _tokens_by_shape(answers: list[Answer] | None) -> dict[Shape, list[float]]:
    out: dict[Shape, list[float]] = {}
    for a in answers or []:
        if a.completion_tokens is not None:
            out.setdefault(request_shape(a), []).append(float(a.completion_tokens))
    return out


def shape_matched(c: VersionEvidence, s: VersionEvidence, min_answers: int) -> ShapeMatched | None:
    """The comparison by shape, where it differs from the pooled one and rests on enough answers: the stable
    answered two shapes or more, each with ``MIN_STABLE_ANSWERS``, and at least ``min_answers`` and half of the
    canary's answers fall in them; else None."""
    stable = _tokens_by_shape(s.answers)
    means = {k: m for k, v in stable.items() if len(v) >= MIN_STABLE_ANSWERS and (m := mean(v)) >= 1.0}
    if len(means) < 2:
        return None
    canary = _tokens_by_shape(c.answers)
    matched = [(t, means[k], k) for k, ts in canary.items() if k in means for t in ts]
    told = sum(len(ts) for ts in canary.values())
    if len(matched) < min_answers or 2 * len(matched) < told:
        return None
    return ShapeMatched(observed=mean(t for t, _, _ in matched), expected=mean(e for _, e, _ in matched),
                        canary=[t / e for t, e, _ in matched],
                        stable=[t / means[k] for k, ts in stable.items() if k in means for t in ts],
                        shapes=len({k for _, _, k in matched}))
