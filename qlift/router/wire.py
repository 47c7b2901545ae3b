"""What crosses the router's admin API, defined once: the router builds these, its client
(``qlift.router.client``) and the rollout read them.

- ``GET /admin/state`` (and every admin change's answer): ``RouterState`` with its ``BackendState``s and
  the ``ShadowState`` in force.
- ``PUT /admin/shadow``: a ``ShadowSettings`` body (``as_dict``); the router checks it with ``parse``.
- ``GET /admin/requests?since=SEQ``: a ``RequestBatch`` of ``RequestRecord``s, sampled ones with an ``AnswerRecord``.
- ``GET /admin/shadow?since=SEQ``: a ``ShadowBatch`` of ``ShadowPair``s, each side a ``ShadowAnswer``.
- ``USAGE_KEYS``: the token-count names the router reads in a backend's ``usage``.

The JSON is documented in docs/router.md: field order here is the order on the wire, and a field the
router leaves out when unset (a shadow's ``partner``, a sample's ``system``, an answer's ``tool_calls``) is
dropped when dumped.
Needs only pydantic, so the client stays cheap to import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

# (prompt, completion) token counts in a backend's ``usage``: chat and completions, then Responses and
# Anthropic Messages.
USAGE_KEYS = (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens"))


@dataclass(frozen=True)
class ShadowSettings:
    """``PUT /admin/shadow``'s body: mirror ``percent`` of the requests other versions serve to ``version``."""

    version: str
    percent: float
    max_inflight: int = 4
    partner: str | None = None  # set: requests either serves are copied to the other (split-window pairs)

    @classmethod
    def parse(cls, data: Any, known: list[str]) -> ShadowSettings:
        """From the admin API's JSON; raises ValueError naming the problem."""
        if not isinstance(data, dict):
            raise ValueError('shadow must be a JSON object like {"version": "canary", "percent": 20}')
        unknown = set(data) - {"version", "percent", "max_inflight", "partner"}
        if unknown:
            raise ValueError(f"unknown shadow field {sorted(unknown)[0]!r}; known: version, percent, max_inflight, "
                             f"partner")
        version, partner = data.get("version"), data.get("partner")
        if version not in known:
            raise ValueError(f"shadow version {version!r} is not a backend; known: {', '.join(known)}")
        if partner is not None and (partner not in known or partner == version):
            raise ValueError(f"shadow partner {partner!r} must be another backend; known: {', '.join(known)}")
        percent = data.get("percent")
        if isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 < percent <= 100:
            raise ValueError(f"shadow percent must be a number in (0, 100], got {percent!r}")
        cap = data.get("max_inflight", 4)
        if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= 1024:
            raise ValueError(f"shadow max_inflight must be an integer 1..1024, got {cap!r}")
        return cls(str(version), float(percent), cap, None if partner is None else str(partner))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "percent": self.percent, "max_inflight": self.max_inflight}
        return out | ({"partner": self.partner} if self.partner else {})

    def target_for(self, primary: str) -> str | None:
        """Where a request ``primary`` serves is copied: the shadow version, or with a partner the other of
        the two; None when it is not copied at all."""
        if self.partner is None:
            return None if primary == self.version else self.version
        return {self.version: self.partner, self.partner: self.version}.get(primary)


class BackendState(BaseModel):
    name: str
    url: str
    served_model: str
    weight: int
    healthy: bool
    in_flight: int
    requests: int
    errors: int
    problem: str | None = None  # why it is out of rotation beyond a failing /health (its model not listed)
    model_hash: str | None = None  # the version's ModelRef content hash (the router config's model_hash)
    identity: str | None = None  # model_hash, else the root its server lists: what a rollout checks each window


class ShadowState(BaseModel):
    """The shadow in force: its settings and what it did since it was set."""

    version: str
    percent: float
    max_inflight: int
    partner: str | None = None  # requests either serves are copied to the other (a split window's pairs)
    sent: int
    dropped: int
    inflight: int = 0
    waiting: int = 0

    @model_serializer(mode="wrap")
    def _partner_only_when_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("partner") is None:
            out.pop("partner", None)
        return out


class RouterState(BaseModel):
    public_model: str | None  # None until the first backend has named its model (no --public-model)
    weights: dict[str, int]
    backends: list[BackendState]
    started_at: str
    seq: int
    shadow: ShadowState | None = None

    def backend(self, name: str) -> BackendState:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)


class ToolFunction(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    """One tool call of a chat answer, in OpenAI's shape (a stream's pieces assembled). ``cut``: its arguments
    were longer than the router keeps (``proxy.CALL_CHARS``); left out unless true, as is a missing ``id``."""

    id: str | None = None
    type: str = "function"
    function: ToolFunction
    cut: bool | None = None

    @model_serializer(mode="wrap")
    def _set_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler(self), ("id", "cut"))

    def as_pair(self) -> tuple[str, str | None]:
        """(name, arguments; None when cut), as ``qlift.quality.toolcalls`` reads a call."""
        return self.function.name, None if self.cut else self.function.arguments


def _without_none(out: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """``out`` less those of ``keys`` whose value is None: fields the wire leaves out when unset."""
    for key in keys:
        if out.get(key) is None:
            out.pop(key, None)
    return out


class AnswerRecord(BaseModel):
    """A sampled answer (the router's ``answer_sample``): the user's message, the answer, the system prompt
    (every system message's text; None without one), the request's response_format (any type), the answer's
    tool calls, and the request's tools (name and parameters each) and tool_choice."""

    prompt: str
    text: str
    system: str | None = None
    response_format: dict[str, Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def request(self) -> dict[str, Any]:
        """The request as the answer checks read it: ``prompt``, and ``system``, ``response_format``, ``tools``
        and ``tool_choice`` when set."""
        out: dict[str, Any] = {"prompt": self.prompt}
        for key in ("system", "response_format", "tools", "tool_choice"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def calls(self) -> tuple[tuple[str, str | None], ...]:
        """The answer's tool calls as the answer checks read them: (name, arguments) each."""
        return tuple(c.as_pair() for c in self.tool_calls or ())


class RequestRecord(BaseModel):
    """One upstream attempt. ``status`` 0 means a connection error or timeout. ``answer`` comes last: the
    router adds it to a sampled record and takes it back when newer samples push it out."""

    seq: int
    time: float
    request_id: str
    backend: str
    status: int
    ok: bool
    replayed: bool
    stream: bool
    latency_s: float
    ttfb_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    client_disconnected: bool = False
    reason: str | None = None  # why it failed: http_5xx, connect, timeout, bad_body, no_choices, no_done, ...
    session: bool = False  # it carried a session key (X-Session-Id or user): sticky to that key's version
    answer: AnswerRecord | None = None


class RequestBatch(BaseModel):
    seq: int
    requests: list[RequestRecord]


class ShadowAnswer(BaseModel):
    """One side of a shadow pair. ``ttft_s``: a stream's first event, or the whole non-streamed answer."""

    backend: str
    status: int
    ok: bool
    reason: str | None = None
    latency_s: float
    ttft_s: float | None = None
    text: str
    finish_reason: str | None = None
    completion_tokens: int | None = None
    tool_calls: list[ToolCall] | None = None  # left out when there are none

    @model_serializer(mode="wrap")
    def _calls_only_when_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler(self), ("tool_calls",))

    def calls(self) -> tuple[tuple[str, str | None], ...]:
        """The answer's tool calls as the answer checks read them: (name, arguments) each."""
        return tuple(c.as_pair() for c in self.tool_calls or ())


class ShadowPair(BaseModel):
    """The same request answered by the version users saw (primary) and by the shadow; ``request`` is what
    the pair keeps of the client's body (``qlift.router.pairs.judge_view``)."""

    seq: int
    rid: str
    ts: float
    path: str
    request: dict[str, Any]
    primary: ShadowAnswer
    shadow: ShadowAnswer


class ShadowBatch(BaseModel):
    next: int  # pass as since= next time
    pairs: list[ShadowPair]
