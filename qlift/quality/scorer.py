"""Answers read by a model a vLLM server serves: how likely it finds each answer after its own request.

One answer's score is the mean negative log-likelihood per answer token (nats) the scoring model gives it, and
the share of its tokens the model finds very unlikely (log-probability under ``low_logprob``: garbled characters,
template debris). The mean alone hides a fifth of a long answer garbled; the share does not.

The request is rendered with the server's own chat template: ``POST /tokenize`` renders the request with the
generation prompt (where the answer starts), and again with the answer as an open final assistant message
(``continue_final_message``: no end-of-turn after it); the tokens after the first rendering are the answer's.
One ``POST /v1/completions`` with those token ids, ``max_tokens`` 1 and vLLM's ``prompt_logprobs`` 0 reads every
prompt token's log-probability: one prefill, no generation. Each answer's first ``max_answer_tokens`` tokens are
scored.

The calls are bounded as the judge's are (concurrency, a per-call timeout and an overall deadline) and go
straight to the server; an answer the server does not score in time (down, slow, refusing) is left unscored,
never scored as bad.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from qlift.quality.registry import message_text

LOW_LOGPROB = -12.0  # under e^-12 (~1 in 160,000): garbled text, template debris, not wording (measured)
VLLM_OWNER = "vllm"  # what vLLM's /v1/models says of its models (owned_by)


@dataclass(frozen=True)
class ScorerSettings:
    url: str  # the server's base URL (no /v1)
    model: str  # its served model name
    concurrency: int = 2
    timeout_s: float = 10.0  # one call
    deadline_s: float = 30.0  # every call of one scoring run
    max_answer_tokens: int = 256  # each answer's first tokens are scored
    max_prompt_tokens: int = 2048  # a longer rendered request is left unscored (its prefill would dominate)
    low_logprob: float = LOW_LOGPROB


@dataclass(frozen=True)
class AnswerScore:
    nll: float  # mean negative log-likelihood per scored answer token, nats
    low_share: float  # share of the scored answer tokens with log-probability under low_logprob
    tokens: int  # answer tokens scored
    prompt_tokens: int  # tokens prefilled for it (the rendered request and the scored answer)


@dataclass
class ScoreRun:
    """One run's scores, in the items' order (None: not scored), and what it cost."""

    scores: list[AnswerScore | None]
    calls: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    down: int = 0  # answers the server did not score in time or failed on (5xx, timeouts, refused connections)
    cannot_read: str | None = None  # the server answered but cannot read answers (no /tokenize, no prompt_logprobs)

    @property
    def scored(self) -> int:
        return sum(1 for s in self.scores if s is not None)

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.scores if s is not None)


class NotScored(Exception):
    """Why one answer was left unscored: the answer (empty, too long for the server), or the server (``down``:
    it may answer later; ``cannot_read``: it answered, without what scoring needs)."""

    def __init__(self, why: str, *, down: bool = False, cannot_read: bool = False) -> None:
        super().__init__(why)
        self.down, self.cannot_read = down, cannot_read


RETRY_LATER = frozenset({408, 429, 500, 502, 503, 504})


def messages_of(request: dict[str, Any]) -> list[dict[str, str]]:
    """The chat messages of a request as text: its ``messages`` where it kept them (shadow pairs), else the system
    prompt and the last user message (the router's split-window request log keeps only those)."""
    kept = [{"role": str(m["role"]), "content": message_text(m.get("content"))}
            for m in request.get("messages") or [] if isinstance(m, dict) and isinstance(m.get("role"), str)]
    if kept:
        return kept
    out = [{"role": "system", "content": request["system"]}] if isinstance(request.get("system"), str) else []
    prompt = request.get("prompt")
    return out + [{"role": "user", "content": prompt if isinstance(prompt, str) else ""}]


def answer_score(logprobs: Sequence[float], prompt_tokens: int, low_logprob: float = LOW_LOGPROB) -> AnswerScore:
    """The score of an answer whose scored tokens had ``logprobs``."""
    n = len(logprobs)
    return AnswerScore(-sum(logprobs) / n, sum(1 for x in logprobs if x < low_logprob) / n, n, prompt_tokens)


def _api_key() -> str | None:
    return os.environ.get("QLIFT_STABLE_READS_API_KEY")  # sent, never logged


def _headers() -> dict[str, str]:
    key = _api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


async def _post(client: Any, s: ScorerSettings, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(f"{s.url}{path}", json={"model": s.model, **body}, timeout=s.timeout_s)
    if r.status_code != 200:
        down = r.status_code in RETRY_LATER
        raise NotScored(f"{path} answered HTTP {r.status_code}", down=down, cannot_read=not down)
    data = r.json()
    if not isinstance(data, dict):
        raise NotScored(f"{path} answered no JSON object", cannot_read=True)
    return data


def _token_logprob(entry: Any, token: int) -> float:
    """The log-probability vLLM's ``prompt_logprobs`` gives ``token`` at its position ({token id: {logprob}})."""
    got = entry.get(str(token)) if isinstance(entry, dict) else None
    if not isinstance(got, dict) or not isinstance(got.get("logprob"), int | float):
        raise NotScored("prompt_logprobs lacks an answer token", cannot_read=True)
    return float(got["logprob"])


async def _score_one(client: Any, s: ScorerSettings, messages: list[dict[str, str]], answer: str
                     ) -> tuple[AnswerScore, int]:
    """(the answer's score, calls made)."""
    prefix, full = await asyncio.gather(
        _post(client, s, "/tokenize", {"messages": messages, "add_generation_prompt": True}),
        _post(client, s, "/tokenize", {"messages": [*messages, {"role": "assistant", "content": answer}],
                                       "add_generation_prompt": False, "continue_final_message": True}))
    head, ids = list(prefix.get("tokens") or []), list(full.get("tokens") or [])
    start = next((i for i, (a, b) in enumerate(zip(head, ids, strict=False)) if a != b), min(len(head), len(ids)))
    if start >= len(ids):
        raise NotScored("empty answer")
    room = int(full.get("max_model_len") or 1 << 30) - 1 - start  # max_tokens 1 must fit too
    end = min(len(ids), start + s.max_answer_tokens, start + room)
    if start > s.max_prompt_tokens or end <= start:
        raise NotScored(f"request over {min(s.max_prompt_tokens, start + room)} tokens")
    data = await _post(client, s, "/v1/completions", {"prompt": ids[:end], "max_tokens": 1, "temperature": 0,
                                                       "prompt_logprobs": 0})
    plp = ((data.get("choices") or [{}])[0] or {}).get("prompt_logprobs")
    if not isinstance(plp, list) or len(plp) < end:
        raise NotScored("/v1/completions gave no prompt_logprobs (not a vLLM server?)", cannot_read=True)
    return answer_score([_token_logprob(plp[i], ids[i]) for i in range(start, end)], end, s.low_logprob), 3


async def ascore(items: Sequence[tuple[list[dict[str, str]], str]], s: ScorerSettings) -> ScoreRun:
    """Score (request messages, answer) items; an item not scored by ``s.deadline_s`` is left unscored."""
    from qlift import httpclient

    out = ScoreRun([None] * len(items))
    sem = asyncio.Semaphore(s.concurrency)
    t0 = time.monotonic()

    async def one(client: Any, messages: list[dict[str, str]], answer: str) -> tuple[AnswerScore, int]:
        async with sem:
            return await _score_one(client, s, messages, answer)

    async with httpclient.async_client(headers=_headers()) as client:
        tasks = [asyncio.ensure_future(one(client, m, a)) for m, a in items]
        _, pending = await asyncio.wait(tasks, timeout=s.deadline_s) if tasks else (set(), set())
        for t in pending:
            t.cancel()
        if pending:
            out.notes.append(f"deadline {s.deadline_s:g}s: {len(pending)} of {len(items)} answers unscored")
            out.down += len(pending)
        why: dict[str, int] = {}
        for i, t in enumerate(tasks):
            if t in pending or t.cancelled():
                continue
            exc = t.exception()
            if exc is None:
                out.scores[i], calls = t.result()
                out.calls += calls
                continue
            if not isinstance(exc, NotScored):  # the connection: refused, reset, timed out
                exc = NotScored(f"{type(exc).__name__} (down or slow)", down=True)
            out.down += exc.down
            out.cannot_read = str(exc) if exc.cannot_read else out.cannot_read
            why[str(exc)] = why.get(str(exc), 0) + 1
        out.notes += [f"{n} unscored: {reason}" for reason, n in why.items()]
    out.seconds = time.monotonic() - t0
    return out


def score_answers(items: Sequence[tuple[list[dict[str, str]], str]], s: ScorerSettings) -> ScoreRun:
    """``ascore`` on its own event loop."""
    return asyncio.run(ascore(items, s))


def vllm_models(url: str, *, timeout_s: float = 5.0) -> list[str] | None:
    """The models ``url`` serves as a vLLM server (its /v1/models entries owned by vLLM; [] where it is another
    server); None where it cannot tell (down, refusing): ask again later."""
    from qlift.vllm.client import NotAModelList, ServerRefused, ServerUnreachable, VllmClient

    try:
        entries = VllmClient(url, api_key=_api_key(), timeout_s=timeout_s).models()
    except (ServerUnreachable, ServerRefused):
        return None
    except NotAModelList:
        return []
    return [m.id for m in entries if m.owned_by == VLLM_OWNER and m.id]
