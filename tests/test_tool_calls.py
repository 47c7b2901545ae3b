"""Tool calls are answers: the router captures them (streamed pieces assembled by index, or whole), keeps them
with the request's tools in its request log and shadow pairs, filters a whole answer's arguments, and the
``tool_call_broken`` check flags broken ones in the rollout and in ``qlift eval``."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import httpx
import pytest
from aiohttp import web
from faults import RouterProcess
from router_backends import ScriptedBackend

from qlift.quality.registry import Answer, answer_flags
from qlift.quality.toolcalls import problem
from qlift.rollout.answer_checks import shadow_answers
from qlift.rollout.carry import dump, load
from qlift.rollout.evidence import from_request_records
from qlift.rollout.shadow import Answer as Side
from qlift.rollout.shadow import Pair, ShadowEvidence
from qlift.router.answers import MAX_SCHEMA_BYTES, kept_tools
from qlift.router.pairs import judge_view
from qlift.router.proxy import CALL_CHARS, CALLS_KEPT, Attempt

TOKEN = "tools-secret"
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city, today.",
                                           "parameters": CITY}},
         {"type": "function", "function": {"name": "time", "parameters": {"type": "object"}}}]
GOOD = '{"city": "北京"}'


class ToolBackend(ScriptedBackend):
    """A chat server that answers a request with tools by calling ``weather`` with ``arguments`` (streamed as
    vLLM does: a chunk with the call's id and name, then the arguments ``piece`` characters at a time), and one
    without tools in prose."""

    def __init__(self, served_model: str, arguments: str, piece: int = 3) -> None:
        self.arguments = arguments
        self.piece = piece
        super().__init__(served_model)

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        weather = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": self.arguments}}
        calls: list[dict[str, Any]] = [weather] if body.get("tools") else []
        head = {"id": "x", "created": 1, "model": self.served_model}
        finish = "tool_calls" if calls else "stop"
        if not body.get("stream"):
            message = {"role": "assistant", "content": None if calls else "It is sunny.", "tool_calls": calls}
            return web.json_response({**head, "object": "chat.completion", "usage": {"prompt_tokens": 5,
                                      "completion_tokens": 7}, "choices": [{"index": 0, "message": message,
                                                                            "finish_reason": finish}]})
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": "" if calls else "It is sunny."}]
        for i, call in enumerate(calls):
            deltas.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                           "function": {"name": call["function"]["name"], "arguments": ""}}]})
            args = call["function"]["arguments"]
            deltas += [{"tool_calls": [{"index": i, "function": {"arguments": args[k:k + self.piece]}}]}
                       for k in range(0, len(args), self.piece)]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events: list[dict[str, Any]] = [{"index": 0, "delta": d, "finish_reason": None} for d in deltas]
        events.append({"index": 0, "delta": {}, "finish_reason": finish})
        for choice in events:
            chunk = {**head, "object": "chat.completion.chunk", "choices": [choice]}
            await resp.write(b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n")
            await asyncio.sleep(0.002)  # each piece its own read at the router
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RouterProcess, ToolBackend, ToolBackend]]:
    """stable (every user's) calls with GOOD arguments, the canary (shadowed, every request) with broken ones."""
    tmp = tmp_path_factory.mktemp("tools")
    words = tmp / "blocked.txt"
    words.write_text("bomb\n", encoding="utf-8")
    with ToolBackend("m-stable", GOOD) as stable, ToolBackend("m-canary", '{"city": "北京"') as canary, \
            RouterProcess("--backend", f"stable={stable.url}", "--backend", f"canary={canary.url}", "--public-model",
                          "pub", "--weight", "stable=100", "--weight", "canary=0", "--filter-file", str(words),
                          log_path=tmp / "router.log", token=TOKEN) as router:
        router.admin().set_shadow("canary", 100, max_inflight=4)
        yield router, stable, canary


def _ask(url: str, *, stream: bool, tools: bool = True, choice: Any = "auto") -> dict[str, Any]:
    body: dict[str, Any] = {"model": "pub", "stream": stream, "max_tokens": 32,
                            "messages": [{"role": "user", "content": "北京今天天气怎么样？"}]}
    if tools:
        body |= {"tools": TOOLS, "tool_choice": choice}
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    if not stream:
        return resp.json()  # type: ignore[no-any-return]
    return {"events": [json.loads(line[6:]) for line in resp.text.splitlines()
                       if line.startswith("data: {")]}


def _wait(cond: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_the_router_keeps_assembled_calls_in_its_request_log_and_pairs_and_the_judge_flags_the_broken_ones(
        routed: tuple[RouterProcess, ToolBackend, ToolBackend]) -> None:
    router, _, _ = routed
    admin = router.admin()
    seq, first = admin.state().seq, admin.shadow_pairs().next
    _ask(router.url, stream=False)
    streamed = _ask(router.url, stream=True)
    _ask(router.url, stream=False, tools=False)
    assert any(e["choices"] and "tool_calls" in e["choices"][0]["delta"] for e in streamed["events"])
    _wait(lambda: admin.shadow_pairs(since=first).next == first + 3)

    records = admin.requests(since=seq).requests
    assert [r.stream for r in records] == [False, True, False]
    for r in records[:2]:
        a = r.answer
        assert a is not None and a.tool_calls is not None and len(a.tool_calls) == 1
        call = a.tool_calls[0]
        assert (call.id, call.type, call.function.name, call.function.arguments) == ("call_1", "function",
                                                                                     "weather", GOOD)
        assert json.loads(call.function.arguments) == {"city": "北京"}  # Chinese round-trips, pieces joined
        assert a.tools == [{"type": "function", "function": {"name": "weather", "parameters": CITY}},
                           TOOLS[1]]  # the description is not kept
        assert a.tool_choice == "auto" and a.request()["tools"] == a.tools
    plain = records[2].answer
    assert plain is not None and (plain.tool_calls, plain.tools, plain.tool_choice) == (None, None, None)
    raw = httpx.get(router.url + f"/admin/requests?since={seq}", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert list(raw["requests"][2]["answer"]) == ["prompt", "text"]  # left out when unset
    assert list(raw["requests"][0]["answer"])[-3:] == ["tool_calls", "tools", "tool_choice"]  # at the end

    stable_answers = from_request_records("stable", records).answers
    assert stable_answers is not None
    assert [answer_flags(x).get("tool_call_broken") for x in stable_answers] == [False, False, None]

    # Pairs are filed as their copies finish: in request order (non-streamed, streamed, no tools) here.
    pairs = sorted(admin.shadow_pairs(since=first).pairs, key=lambda p: ("tools" not in p.request,
                                                                        bool(p.request.get("stream"))))
    for p in pairs[:2]:
        assert p.request["tools"][0]["function"]["name"] == "weather" and p.request["tool_choice"] == "auto"
        assert p.primary.calls() == (("weather", GOOD),) and p.shadow.calls() == (("weather", '{"city": "北京"'),)
    assert pairs[2].shadow.tool_calls is None and "tools" not in pairs[2].request
    raw_pairs = httpx.get(router.url + f"/admin/shadow?since={first}",
                          headers={"Authorization": f"Bearer {TOKEN}"}).json()["pairs"]
    shadows = [list(p["shadow"]) for p in raw_pairs]
    assert sorted(s[-1] for s in shadows) == ["completion_tokens", "tool_calls", "tool_calls"]  # left out, or last

    ev = ShadowEvidence("stable", "canary", [Pair(p.seq, p.request, Side.from_wire(p.primary),
                                                  Side.from_wire(p.shadow), p.path) for p in pairs])
    for held in (ev, load(*dump(ev))):  # also after the journal's round trip
        assert isinstance(held, ShadowEvidence)
        canary, stable = shadow_answers(held, None)
        assert [answer_flags(x).get("tool_call_broken") for x in canary] == [True, True, None]
        assert [answer_flags(x).get("tool_call_broken") for x in stable] == [False, False, None]


def test_a_blocked_word_in_a_whole_answers_call_arguments_drops_the_call(
        routed: tuple[RouterProcess, ToolBackend, ToolBackend]) -> None:
    router, stable, _ = routed
    admin = router.admin()
    seq = admin.state().seq
    stable.arguments = '{"city": "\\u0062omb town"}'  # JSON escapes: the filter reads "bomb town"
    try:
        answer = _ask(router.url, stream=False)
    finally:
        stable.arguments = GOOD
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "content_filter" and choice["message"]["tool_calls"] == []
    record = admin.requests(since=seq).requests[0]
    assert record.finish_reason == "content_filter" and record.answer is not None
    assert record.answer.tool_calls is None  # the record keeps what the client got
    assert _ask(router.url, stream=False)["choices"][0]["finish_reason"] == "tool_calls"  # a clean one passes


def _streamed(*chunks: dict[str, Any]) -> Attempt:
    att = Attempt("b", stream=True, capture=True)
    for delta in chunks:
        att.take_event({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    return att


def test_a_stream_is_assembled_by_index_and_bounded() -> None:
    att = _streamed(
        {"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "wea", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "time"}}]},
        {"tool_calls": [{"index": 0, "function": {"name": "ther", "arguments": '{"city": "北'}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '京"}'}}]})
    calls = att.tool_calls
    assert calls is not None and [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("a", "weather", GOOD), ("b", "time", "{}")]
    assert _streamed({"content": "no calls"}).tool_calls is None

    many = _streamed({"tool_calls": [{"index": i, "function": {"name": "time", "arguments": "{}"}}
                                     for i in range(CALLS_KEPT + 5)]})
    assert many.tool_calls is not None and len(many.tool_calls) == CALLS_KEPT
    long_args = json.dumps({"city": "北" * CALL_CHARS})
    big = _streamed({"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": long_args}}]},
                    {"tool_calls": [{"index": 1, "function": {"name": "weather", "arguments": GOOD}}]})
    assert big.tool_calls is not None and [c.cut for c in big.tool_calls] == [True, True]
    assert sum(len(c.function.arguments) for c in big.tool_calls) == CALL_CHARS
    # A call cut by the router is checked by name only: its arguments are no fault of the model's.
    cut = Answer({"prompt": "x", "tools": TOOLS}, "", tool_calls=tuple(c.as_pair() for c in big.tool_calls))
    assert answer_flags(cut).get("tool_call_broken") is False


def test_the_judge_view_and_the_sample_keep_tool_names_and_schemas_within_bounds() -> None:
    view = judge_view({"model": "pub", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                       "tool_choice": {"type": "function", "function": {"name": "weather", "strict": True}}})
    assert [t["function"] for t in view["tools"]] == [{"name": "weather", "parameters": CITY}, TOOLS[1]["function"]]
    assert view["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(MAX_SCHEMA_BYTES // 10)}}
    names_only = kept_tools([{"type": "function", "function": {"name": "big", "parameters": wide}}])
    assert names_only == [{"type": "function", "function": {"name": "big"}}]
    assert kept_tools([{"type": "function", "function": {"name": f"f{i}"}} for i in range(1000)]) is None
    assert kept_tools("not a list") is None and "tools" not in judge_view({"messages": []})


OFFERED = {"prompt": "北京今天天气怎么样？", "tools": TOOLS}


@pytest.mark.parametrize(("request_", "calls", "text", "rule"), [
    (OFFERED, (("weather", GOOD),), "", None),
    (OFFERED, (("weather", GOOD), ("time", "")), "", None),  # "" is a call without arguments
    (OFFERED | {"tool_choice": "auto"}, (), "北京今天晴。", None),  # prose is allowed with "auto"
    (OFFERED | {"tool_choice": "required"}, (("time", "{}"),), "", None),
    (OFFERED, (("weather", '{"city": "北京"'),), "", "arguments_not_json (weather)"),
    (OFFERED, (("weather", '["北京"]'),), "", "arguments_not_json (weather)"),
    (OFFERED, (("weather", '{"city": 1}'),), "", "arguments_off_schema (weather)"),
    (OFFERED, (("weather", "{}"),), "", "arguments_off_schema (weather)"),
    (OFFERED, (("get_weather", GOOD),), "", "unknown_tool (get_weather)"),
    (OFFERED | {"tool_choice": "required"}, (), "北京今天晴。", "no_call"),
    (OFFERED | {"tool_choice": {"type": "function", "function": {"name": "weather"}}}, (("time", "{}"),), "",
     "no_call (weather)"),
    (OFFERED, (), '<tool_call>\n{"name": "weather", "arguments": {"city": "北京"}\n</tool_call>',
     "tool_call_text_broken"),
    (OFFERED, (), '<tool_call>\n{"name": "weather", "arguments": {"city": "北京"}}\n</tool_call>', None),
    (OFFERED, (), '<tool_call>\n{"name": "weather", "arguments": {"town": "北京"}}\n</tool_call>',
     "arguments_off_schema (weather)"),
    (OFFERED | {"tool_choice": "required"}, (),
     '<tool_call>\n{"name": "weather", "arguments": {"city": "北京"}}\n</tool_call>', None),
])
def test_tool_call_broken_names_the_rule_that_fired(request_: dict[str, Any], calls: tuple[tuple[str, str], ...],
                                                     text: str, rule: str | None) -> None:
    assert problem(request_, calls, text) == rule
    assert answer_flags(Answer(request_, text, tool_calls=calls))["tool_call_broken"] is (rule is not None)


def test_tool_call_broken_does_not_apply_without_tools_or_with_tool_choice_none() -> None:
    for request_ in ({"prompt": "hi"}, OFFERED | {"tool_choice": "none"}, {"prompt": "hi", "tools": []}):
        assert "tool_call_broken" not in answer_flags(Answer(request_, "<tool_call>{oops</tool_call>",
                                                             tool_calls=(("x", "{"),)))


def test_eval_sends_an_examples_tools_and_scores_the_calls_it_gets_back() -> None:
    from qlift.eval.endpoint import EndpointBackend
    from qlift.eval.generation import EvalModel, Request, Sampling, cache_key
    from qlift.eval.metrics import score
    from qlift.eval.prompts import Example

    ex = Example.model_validate({"id": "w", "messages": [{"role": "user", "content": "北京天气？"}], "tools": TOOLS,
                                 "tool_choice": "required"})
    assert ex.prompt_key()["tools"] == TOOLS and ex.prompt_key()["tool_choice"] == "required"
    with pytest.raises(ValueError, match="need 'messages'"):
        Example.model_validate({"id": "p", "prompt": "x", "tools": TOOLS})
    backend = EndpointBackend(retries=0)
    for arguments, flagged in ((GOOD, 0.0), ('{"city": 北京}', 1.0)):
        with ToolBackend("m", arguments) as server:
            gen = backend.generate(EvalModel("candidate", "m", endpoint=server.url), [Request.of(ex)], Sampling())[0]
        assert gen.tool_calls == [("weather", arguments)]
        got = score("tool_call_broken", ex, gen)
        assert got is not None and got.value == flagged
    # A request without tools keeps the cache key it had before tools existed.
    plain = Request([{"role": "user", "content": "hi"}], None, None)
    before = {"model": "h", "backend": "b", "request": {"messages": plain.messages, "prompt": None, "reference": None},
              "sampling": asdict(Sampling())}
    assert cache_key("h", "b", plain, Sampling()) == hashlib.sha256(
        json.dumps(before, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    assert cache_key("h", "b", Request.of(ex), Sampling()) != cache_key("h", "b", plain, Sampling())


def test_a_flagged_example_shows_the_calls_a_person_needs_to_see() -> None:
    from qlift.quality.registry import examples

    answers = [Answer(OFFERED, "", tool_calls=(("weather", GOOD),)), Answer(OFFERED, "", tool_calls=(("weather",
                                                                                                       "{}"),))]
    shown = examples(answers, "tool_call_broken")
    assert [e["answer"] for e in shown] == ["weather({})"] and shown[0]["prompt"] == OFFERED["prompt"]


def test_the_journal_keeps_a_split_windows_tool_calls() -> None:
    from qlift.rollout.carry import dump_version, load_version
    from qlift.rollout.evidence import VersionEvidence

    ev = VersionEvidence("canary", answers=[Answer(OFFERED, "", tool_calls=(("weather", '{"city": 1}'),))])
    back = load_version(dump_version(ev))
    assert back.answers is not None and back.answers[0].tool_calls == (("weather", '{"city": 1}'),)
    assert answer_flags(back.answers[0])["tool_call_broken"] is True


def test_offline_backends_render_an_examples_tools_into_the_chat_template() -> None:
    """The vLLM and transformers backends prompt with ``prompt_token_ids``: tools go to the chat template, as
    ``llm.chat(tools=)`` does; calls come back as <tool_call> text, which the check reads (above)."""
    from qlift.models.chat import prompt_token_ids

    class Template:  # what prompt_token_ids asks of a tokenizer: the template's text, one id per character
        chat_template = "{{ tools }}"

        def apply_chat_template(self, messages: list[dict[str, str]], *, add_generation_prompt: bool, tokenize: bool,
                                tools: list[dict[str, Any]] | None = None) -> str:
            return json.dumps({"messages": messages, "tools": tools}, ensure_ascii=False)

        def __call__(self, text: str, *, add_special_tokens: bool) -> dict[str, list[int]]:
            return {"input_ids": [ord(c) for c in text]}

    messages = [{"role": "user", "content": "北京天气？"}]
    rendered = {tools is not None: json.loads("".join(map(chr, prompt_token_ids(
        Template(), {"messages": messages, "prompt": None, "tools": tools})))) for tools in (TOOLS, None)}
    assert rendered[True]["tools"] == TOOLS and rendered[False]["tools"] is None
    assert rendered[True]["messages"] == messages
