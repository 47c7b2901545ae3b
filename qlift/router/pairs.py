"""Shadow pairs for the judge (``GET /admin/shadow``): what it reads of a request and of both answers,
capped, in a ring bounded in pairs and in bytes, so no client can make the router keep its bodies.

The judge (``qlift.rollout.shadow``) reads a pair's ``request["messages"]`` (role and text),
``request["prompt"]``, ``request["response_format"]`` and ``request["stream"]``, and each answer's
``text``: those are kept, in those shapes, up to the caps below; the rest of a body is not kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from qlift.quality.registry import message_text
from qlift.router.answers import MAX_SCHEMA_BYTES, Bounded
from qlift.router.proxy import CAPTURE_CHARS, Attempt

PAIRS_KEPT = 2000
RING_BYTES = 64 << 20  # the ring's pairs, measured as their JSON, at most this; the oldest go first
PROMPT_CHARS = 8000  # a pair's prompt text (its messages' together, or its prompt) at most
TEXT_CHARS = CAPTURE_CHARS  # an answer's text at most (Attempt stops capturing there)
RESPONSE_FORMAT_BYTES = MAX_SCHEMA_BYTES  # a larger response_format is kept as its type only


def _messages(messages: list[Any], budget: int) -> tuple[list[dict[str, str]], bool]:
    """Role and text of each message, PROMPT_CHARS in all: the last messages first (the question asked),
    each cut to what is left; earlier messages past the budget are left out."""
    kept: list[dict[str, str]] = []
    cut = False
    for m in reversed(messages):
        if not isinstance(m, dict):
            continue
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
    return view


def answer_record(att: Attempt) -> dict[str, Any]:
    """One side of a pair (REC): what the judge compares."""
    return {"backend": att.backend, "status": att.status, "ok": att.ok, "reason": att.reason,
            "latency_s": round(att.latency_s, 6), "ttft_s": None if att.ttfb_s is None else round(att.ttfb_s, 6),
            "text": att.text[:TEXT_CHARS], "finish_reason": att.finish_reason,
            "completion_tokens": att.completion_tokens}


@dataclass
class Pair:
    rid: str
    ts: float
    path: str
    request: dict[str, Any]  # judge_view() of the client's body
    primary: dict[str, Any] | None = None
    shadow: dict[str, Any] | None = None


class PairRing:
    """Finished pairs, oldest first: the last ``pairs_kept`` of them and at most ``max_bytes`` of JSON
    (they outlive a shadow turned off)."""

    def __init__(self, pairs_kept: int = PAIRS_KEPT, max_bytes: int = RING_BYTES) -> None:
        self.ring = Bounded(pairs_kept, max_bytes)
        self.seq = 0

    @property
    def bytes(self) -> int:
        return self.ring.bytes

    def finish(self, pair: Pair) -> None:
        """File a pair once both sides are in; the oldest go while over either bound."""
        if pair.primary is None or pair.shadow is None:
            return
        self.seq += 1
        record = {"seq": self.seq, "rid": pair.rid, "ts": pair.ts, "path": pair.path, "request": pair.request,
                  "primary": pair.primary, "shadow": pair.shadow}
        self.ring.add(record, len(json.dumps(record).encode()))

    def since(self, seq: int) -> dict[str, Any]:
        start = seq if seq <= self.seq else 0  # a seq from before a restart: everything kept
        pairs = [p for p, _ in self.ring.items if p["seq"] > start]
        return {"next": pairs[-1]["seq"] if pairs else self.seq, "pairs": pairs}
