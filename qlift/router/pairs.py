"""Shadow pairs for the judge (``GET /admin/shadow``): what it reads of a request and of both answers,
capped, in a ring bounded in pairs and in bytes, so no client can make the router keep its bodies.

The judge (``qlift.rollout.shadow``) reads a pair's ``request["messages"]`` (role and text),
``request["prompt"]``, ``request["response_format"]``, ``request["tools"]`` (name and parameters each:
``answers.kept_tools``), ``request["tool_choice"]`` and ``request["stream"]``, and each answer's ``text`` and
``tool_calls``: those are kept, in those shapes, up to the caps below; the rest of a body is not kept.

The ring is bounded in memory, not in JSON: a filed pair is kept as its compact JSON bytes (what
``GET /admin/shadow`` sends, joined), and counted as the bytes object plus PAIR_OVERHEAD_BYTES for the
ring's own tuples and counters. Whatever clients send, the ring holds at most RING_BYTES of memory
(a test fills it with adversarial shapes under tracemalloc). Before, it kept parsed dicts bounded by
their JSON: a request of 8,000 one-character messages kept ~2 MiB of dicts and strings for ~240 KB of
JSON, and the router grew ~2 MiB a shadowed request (issue 43). Messages are capped per pair too
(MESSAGES_KEPT), so the pair in flight, a dict until both answers are in, stays small.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from qlift.quality.registry import message_text
from qlift.router.answers import MAX_SCHEMA_BYTES, Bounded, kept_tool_choice, kept_tools
from qlift.router.memsize import compact_json
from qlift.router.proxy import CAPTURE_CHARS, Attempt
from qlift.router.wire import ShadowAnswer, ShadowPair

PAIRS_KEPT = 2000
RING_BYTES = 64 << 20  # the ring's memory (pairs as JSON bytes + PAIR_OVERHEAD_BYTES each) at most; oldest go first
PAIR_OVERHEAD_BYTES = 256  # a filed pair's tuples, ints and deque slot beside its bytes (measured ~210 on 3.11)
PROMPT_CHARS = 8000  # a pair's prompt text (its messages' together, or its prompt) at most
MESSAGES_KEPT = 64  # messages a pair keeps at most: the last ones, and the first SYSTEM_KEPT system messages
SYSTEM_KEPT = 8
TEXT_CHARS = CAPTURE_CHARS  # an answer's text at most (Attempt stops capturing there)
Blob = bytes  # a filed pair's JSON (PairRing.bytes, a count, shadows the name inside the class)
RESPONSE_FORMAT_BYTES = MAX_SCHEMA_BYTES  # a larger response_format is kept as its type only


def _chosen(messages: list[Any]) -> tuple[list[dict[str, Any]], bool]:
    """The messages a pair may keep: the first SYSTEM_KEPT system messages and the last of the others, at most
    MESSAGES_KEPT in all, in their order; True when some were left out."""
    dicts = [m for m in messages if isinstance(m, dict)]
    if len(dicts) <= MESSAGES_KEPT:
        return dicts, False
    system = list(islice((i for i, m in enumerate(dicts) if m.get("role") == "system"), SYSTEM_KEPT))
    kept_system, room, others = set(system), MESSAGES_KEPT - len(system), []
    for i in range(len(dicts) - 1, -1, -1):  # from the end: a request may carry 20,000 messages
        if i not in kept_system:
            others.append(i)
            if len(others) == room:
                break
    return [dicts[i] for i in sorted(system + others)], True


def _messages(messages: list[Any], budget: int) -> tuple[list[dict[str, str]], bool]:
    """Role and text of each chosen message (``_chosen``), PROMPT_CHARS in all: the last messages first (the
    question asked), each cut to what is left; earlier messages past the budget are left out."""
    kept: list[dict[str, str]] = []
    chosen, cut = _chosen(messages)
    for m in reversed(chosen):
        text = message_text(m.get("content"))
        if budget <= 0:
            cut = True
            break
        cut = cut or len(text) > budget
        role = m.get("role")
        kept.append({"role": role if isinstance(role, str) else "", "content": text[:budget]})
        budget -= len(kept[-1]["content"])
    return kept[::-1], cut


def judge_view(body: dict[str, Any]) -> dict[str, Any]:
    """What a pair keeps of a client's request. ``truncated``: some prompt text was cut;
    ``response_format_dropped``: a response_format over RESPONSE_FORMAT_BYTES kept as its type only."""
    view: dict[str, Any] = {k: body[k] for k in ("model", "stream", "max_tokens")
                            if isinstance(body.get(k), str | int | float | bool)}
    messages, prompt = body.get("messages"), body.get("prompt")
    if isinstance(messages, list):
        view["messages"], cut = _messages(messages, PROMPT_CHARS)
        view["truncated"] = cut
    elif isinstance(prompt, str):
        view["prompt"] = prompt[:PROMPT_CHARS]
        view["truncated"] = len(prompt) > PROMPT_CHARS
    fmt = body.get("response_format")
    if fmt is not None:
        if len(json.dumps(fmt)) <= RESPONSE_FORMAT_BYTES:
            view["response_format"] = fmt
        else:
            view["response_format"] = {"type": fmt.get("type")} if isinstance(fmt, dict) else None
            view["response_format_dropped"] = True
    tools, choice = kept_tools(body.get("tools")), kept_tool_choice(body.get("tool_choice"))
    if tools is not None:
        view["tools"] = tools
    if choice is not None:
        view["tool_choice"] = choice
    return view


def answer_record(att: Attempt) -> ShadowAnswer:
    """One side of a pair: what the judge compares."""
    return ShadowAnswer(backend=att.backend, status=att.status, ok=att.ok, reason=att.reason,
                        latency_s=round(att.latency_s, 6), ttft_s=None if att.ttfb_s is None else round(att.ttfb_s, 6),
                        text=att.text[:TEXT_CHARS], finish_reason=att.finish_reason,
                        completion_tokens=att.completion_tokens, tool_calls=att.tool_calls)


@dataclass
class Pair:
    rid: str
    ts: float
    path: str
    request: dict[str, Any]  # judge_view() of the client's body
    primary: ShadowAnswer | None = None
    shadow: ShadowAnswer | None = None


class PairRing:
    """Finished pairs, oldest first, each as (seq, its JSON bytes): the last ``pairs_kept`` of them and at most
    ``max_bytes`` of memory, PAIR_OVERHEAD_BYTES a pair included (they outlive a shadow turned off)."""

    def __init__(self, pairs_kept: int = PAIRS_KEPT, max_bytes: int = RING_BYTES) -> None:
        self.ring = Bounded(pairs_kept, max_bytes)
        self.seq = 0

    @property
    def bytes(self) -> int:
        return self.ring.bytes

    def finish(self, pair: Pair) -> None:
        """File a pair (a ``ShadowPair``, kept as its JSON) once both sides are in; the oldest go while over
        either bound."""
        if pair.primary is None or pair.shadow is None:
            return
        self.seq += 1
        filed = ShadowPair(seq=self.seq, rid=pair.rid, ts=pair.ts, path=pair.path, request=pair.request,
                           primary=pair.primary, shadow=pair.shadow)
        blob = compact_json(filed.model_dump())  # not model_dump_json: CJK as UTF-8, lone surrogates escaped
        self.ring.add((self.seq, blob), sys.getsizeof(blob) + PAIR_OVERHEAD_BYTES)

    def _after(self, seq: int) -> Iterator[tuple[int, Blob]]:
        start = seq if seq <= self.seq else 0  # a seq from before a restart: everything kept
        return (item for item, _ in self.ring.items if item[0] > start)

    def since_json(self, seq: int) -> Blob:
        """``GET /admin/shadow``'s body: ``{"next": N, "pairs": [...]}``, joined from the kept bytes."""
        kept = list(self._after(seq))
        nxt = kept[-1][0] if kept else self.seq
        return b'{"next":%d,"pairs":[%s]}' % (nxt, b",".join(blob for _, blob in kept))

    def since(self, seq: int) -> dict[str, Any]:
        """The same, parsed (tests and in-process readers)."""
        out: dict[str, Any] = json.loads(self.since_json(seq))
        return out
