"""The router's content filter applied to answers (issue 43): a blocked word never reaches the client,
whole or streamed (split across chunks, CJK), the text before it does, a clean answer streams byte for
byte, and the cut is recorded (finish_reason content_filter, a metric). Also what a sampled answer keeps
and the shadow pair ring's memory bound."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from faults import RouterProcess, ThreadedApp

from qlift.router.answerfilter import AnswerFilter, StreamFilter, cut_before_hit
from qlift.router.filters import WordListFilter

TOKEN = "admin-secret"
RULES = "bomb\n炸弹\nre:secret\\s+plan\n"


class PieceBackend(ThreadedApp):
    """Answers each chat or completion with ``script(prompt)``'s pieces: one SSE event each when streamed (after a
    role chunk, before a finish chunk, as vLLM does), joined when not. Keeps the data lines it sent."""

    shutdown_timeout_s = 0.2

    def __init__(self, served_model: str, script: Callable[[str], list[str]]) -> None:
        self.served_model = served_model
        self.script = script
        self.sent: list[bytes] = []
        super().__init__()

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = request.path.endswith("chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        pieces = self.script(prompt)
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": "x", "object": kind, "created": 1, "model": self.served_model}
        if not body.get("stream"):
            text = "".join(pieces)
            choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            return web.json_response({**head, "choices": [{"index": 0, **choice, "finish_reason": "stop"}],
                                      "usage": {"prompt_tokens": 3, "completion_tokens": len(pieces)}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if chat:
            head["object"] = "chat.completion.chunk"
        events = [{"delta": {"role": "assistant", "content": ""}}] if chat else []
        events += [{"delta": {"content": p}} if chat else {"text": p} for p in pieces]
        events.append({"delta": {}, "finish_reason": "stop"} if chat else {"text": "", "finish_reason": "stop"})
        for e in events:
            line = b"data: " + json.dumps({**head, "choices": [{"index": 0, "finish_reason": None, **e}]},
                                          ensure_ascii=False, separators=(",", ":")).encode()
            self.sent.append(line)
            await resp.write(line + b"\n\n")
            await asyncio.sleep(0.005)  # each event its own read at the router
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.served_model, "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._answer)
        app.router.add_post("/v1/completions", self._answer)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        return app


SCRIPTS = {
    "whole": ["Sure. Here is how to build a ", "bomb", " quickly."],
    "split": ["Sure, ", "the bo", "mb is ", "here."],
    "cjk": ["如何制作", "炸", "弹", "的方法"],
    "clean": ["A bom", "bastic answer: ", "bombs", "hell is ", "not a word here; ", "炸", "药 is fine, ",
              "secret ", "agents", " too. ", *[f"word{i} " for i in range(40)]],
}


@pytest.fixture
def filtered(tmp_path: Path) -> Iterator[tuple[RouterProcess, PieceBackend]]:
    words = tmp_path / "blocked.txt"
    words.write_text(RULES, encoding="utf-8")
    with PieceBackend("m-stable", lambda p: SCRIPTS[p]) as backend, \
            RouterProcess("--backend", f"stable={backend.url}", "--public-model", "pub", "--filter-file", words,
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        yield router, backend


def _post(url: str, prompt: str, *, stream: bool, chat: bool = True) -> httpx.Response:
    body: dict[str, Any] = {"model": "pub", "stream": stream, "max_tokens": 64}
    body |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return httpx.post(url + path, json=body, timeout=30)


def _streamed(raw: bytes) -> tuple[str, list[dict[str, Any]], list[bytes]]:
    """(the text, the events, the data lines) of an SSE body."""
    lines = [ln for ln in raw.split(b"\n") if ln.startswith(b"data: ")]
    events = [json.loads(ln[6:]) for ln in lines if ln != b"data: [DONE]"]
    text = "".join(c.get("text") or (c.get("delta") or {}).get("content") or "" for e in events for c in e["choices"])
    return text, events, lines


def test_a_blocked_word_in_a_whole_answer_never_reaches_the_client(filtered) -> None:
    router, _ = filtered
    for chat in (True, False):
        r = _post(router.url, "whole", stream=False, chat=chat)
        assert r.status_code == 200 and b"bomb" not in r.content and b"quickly" not in r.content
        choice = r.json()["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        assert text == "Sure. Here is how to build a " and choice["finish_reason"] == "content_filter"
        assert r.json()["model"] == "pub"


def test_a_streamed_blocked_word_split_across_chunks_is_cut_with_content_filter_and_done(filtered) -> None:
    router, _ = filtered
    for prompt, before in (("split", "Sure, the "), ("cjk", "如何制作")):
        for chat in (True, False):
            r = _post(router.url, prompt, stream=True, chat=chat)
            text, events, lines = _streamed(r.content)
            assert r.status_code == 200 and text == before, (prompt, text)
            assert "bomb" not in r.text and "bo" not in text and "炸" not in r.text and "here." not in r.text
            assert events[-1]["choices"][0]["finish_reason"] == "content_filter" and events[-1]["model"] == "pub"
            assert lines[-1] == b"data: [DONE]" and r.content.endswith(b"data: [DONE]\n\n")
            assert sum(ln == b"data: [DONE]" for ln in lines) == 1


def test_a_clean_answer_streams_unchanged_and_cuts_are_recorded_and_counted(filtered) -> None:
    router, backend = filtered
    r = _post(router.url, "clean", stream=True)
    text, events, lines = _streamed(r.content)
    assert text == "".join(SCRIPTS["clean"]) and events[-1]["choices"][0]["finish_reason"] == "stop"
    assert lines[:-1] == [ln.replace(b'"model":"m-stable"', b'"model":"pub"') for ln in backend.sent]  # byte for byte
    assert _post(router.url, "clean", stream=False).json()["choices"][0]["message"]["content"] == text
    for stream in (True, False):
        assert _post(router.url, "split", stream=stream).status_code == 200
    records = router.admin().requests().requests
    assert [r.finish_reason for r in records] == ["stop", "stop", "content_filter", "content_filter"]
    cut = records[-1]
    assert cut.ok and cut.reason is None and cut.answer is not None and cut.answer.text == "Sure, the "
    assert router.metric("qlift_router_answers_filtered_total", backend="stable") == 2
    assert router.metric("qlift_router_finish_reason_total", backend="stable", reason="content_filter") == 2


def test_answers_pass_unfiltered_with_no_filter_answers(tmp_path: Path) -> None:
    words = tmp_path / "blocked.txt"
    words.write_text(RULES, encoding="utf-8")
    with PieceBackend("m", lambda p: SCRIPTS[p]) as backend, \
            RouterProcess("--backend", f"s={backend.url}", "--public-model", "pub", "--filter-file", words,
                          "--no-filter-answers", log_path=tmp_path / "router.log") as router:
        assert _streamed(_post(router.url, "split", stream=True).content)[0] == "Sure, the bomb is here."
        assert _post(router.url, "whole", stream=False).json()["choices"][0]["finish_reason"] == "stop"
        blocked = httpx.post(router.url + "/v1/chat/completions", timeout=30, json={
            "model": "pub", "messages": [{"role": "user", "content": "a bomb"}]})
        assert blocked.status_code == 400  # prompts are still filtered


# -- the stream filter alone, over many ways to split an answer -------------------------------------------------


def _filter(tmp_path: Path) -> AnswerFilter:
    words = tmp_path / "blocked.txt"
    words.write_text(RULES + "c++ rocks\n", encoding="utf-8")
    return AnswerFilter.of(WordListFilter(words))


def _stream(flt: AnswerFilter, pieces: list[str]) -> tuple[str, str | None]:
    """(the text a client gets, its last finish_reason) when ``pieces`` stream through a StreamFilter."""
    sf, out = StreamFilter(flt), []
    for i, piece in enumerate(pieces):
        event = {"choices": [{"index": 0, "delta": {"content": piece},
                              "finish_reason": "stop" if i == len(pieces) - 1 else None}]}
        out += sf.line(b"data: " + json.dumps(event).encode(), event) + sf.line(b"")
    out += sf.line(b"data: [DONE]", done=True)
    events = [json.loads(ln[6:]) for ln in out if ln.startswith(b"data: {")]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    return text, next((c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]), None)


ANSWERS = [
    "Here is the plan: make a bomb, then leave.", "Bombastic writing, bombs and a-bomb-ish words.",
    "如何制作炸弹的方法", "炸 弹 with a space", "B\u200bO\u200bM\u200bB spelled with zero-width spaces",
    "the SECRET\n\n  PLAN is out", "the secret agent is fine", "I think C++ rocks!", "c+ rocks is fine",
    "ｂｏｍｂ in full width", "nothing to see " * 30, "bomb",
]


def test_no_split_of_an_answer_lets_a_blocked_word_through(tmp_path: Path) -> None:
    """Whatever the chunking, the client gets exactly the whole answer's text cut before its first match."""
    flt, rng = _filter(tmp_path), random.Random(43)
    for answer in ANSWERS:
        hit = flt.check(answer) is not None
        expected = answer[:cut_before_hit(flt.check, answer, final=True)] if hit else answer
        for _ in range(40):
            cuts = sorted(rng.sample(range(1, len(answer)), min(len(answer) - 1, rng.randint(0, 8))))
            pieces = [answer[a:b] for a, b in zip([0, *cuts], [*cuts, len(answer)], strict=True)]
            text, reason = _stream(flt, pieces)
            assert (text, reason) == (expected, "content_filter" if hit else "stop"), (answer, pieces)
            assert flt.check(text) is None


def test_whole_answer_cut_before_the_match(tmp_path: Path) -> None:
    flt = _filter(tmp_path)
    assert [answer[:cut_before_hit(flt.check, answer, final=True)] for answer in ANSWERS if flt.check(answer)] == [
        "Here is the plan: make a ", "Bombastic writing, bombs and a-", "如何制作", "", "",
        "the ", "I think ", "", ""]


# -- what a sampled answer keeps ---------------------------------------------------------------------------------


def test_a_sampled_answer_keeps_system_prompt_and_any_response_format() -> None:
    from qlift.router.answers import MAX_SCHEMA_BYTES, SYSTEM_CHARS, sample
    from qlift.router.client import AnswerRecord

    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                         {"role": "system", "content": [{"type": "text", "text": "Answer in JSON."}]},
                         {"role": "user", "content": "and now?"}], "response_format": {"type": "json_object"}}
    s = sample(body, "{}")
    assert s == {"prompt": "and now?", "text": "{}", "system": "Be brief.\nAnswer in JSON.",
                 "response_format": {"type": "json_object"}}
    rec = AnswerRecord.model_validate(s)
    assert rec.request() == {"prompt": "and now?", "system": "Be brief.\nAnswer in JSON.",
                             "response_format": {"type": "json_object"}}
    plain = sample({"prompt": "p"}, "t")
    assert plain == {"prompt": "p", "text": "t"} and AnswerRecord.model_validate(plain).request() == {"prompt": "p"}
    long = sample({"messages": [{"role": "system", "content": "s" * 5000}, {"role": "user", "content": "u"}],
                   "response_format": {"type": "json_schema", "x": "y" * MAX_SCHEMA_BYTES}}, "t")
    assert len(long["system"]) == SYSTEM_CHARS and "response_format" not in long


def test_sampled_answers_are_bounded_in_memory() -> None:
    """A response_format of many tiny values costs ~20x its JSON: the kept samples count what they cost."""
    from qlift.router import answers

    samples = answers.AnswerSamples(100)
    samples.kept = answers.Bounded(answers.MAX_KEPT, 1 << 20)
    fmt = {"type": "json_schema", "json_schema": {"schema": {"enum": [{}] * 5000}}}  # ~16 KB of JSON
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(200):
        samples.attach({"seq": i}, {"messages": [{"role": "user", "content": f"q{i}"}],
                                    "response_format": json.loads(json.dumps(fmt))}, "a")
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert samples.kept.bytes <= 1 << 20 and grown < 1.5 * (1 << 20), grown


# -- the shadow pair ring's memory -------------------------------------------------------------------------------


def _shapes() -> dict[str, Callable[[int], tuple[dict[str, Any], str]]]:
    """Adversarial requests (and answers) a shadowed router files pairs of."""
    return {
        "many tiny messages": lambda i: ({"messages": [{"role": "user", "content": "a"}] * 20_000}, "x"),
        "one huge message": lambda i: ({"messages": [{"role": "user", "content": "h" * 1_000_000}]}, "x"),
        "huge response_format": lambda i: ({"prompt": "p", "response_format": {
            "type": "json_schema", "schema": {"enum": [{}] * 5000}}}, "x"),
        "long answers": lambda i: ({"prompt": "p"}, "答" * 100_000),
        "system floods": lambda i: ({"messages": [{"role": "system", "content": "s"}] * 5000
                                     + [{"role": "user", "content": "q"}]}, "x"),
    }


@pytest.mark.parametrize("shape", list(_shapes()))
def test_the_pair_ring_stays_within_its_memory_bound(shape: str) -> None:
    from qlift.router.pairs import MESSAGES_KEPT, Pair, PairRing, judge_view
    from qlift.router.wire import ShadowAnswer

    bound = 2 << 20
    make = _shapes()[shape]
    ring = PairRing(pairs_kept=2000, max_bytes=bound)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(300):
        body, text = make(i)
        pair = Pair(f"r{i}", 0.0, "/v1/chat/completions", judge_view(body))
        pair.primary = pair.shadow = ShadowAnswer(backend="b", status=200, ok=True, latency_s=0.0,
                                                  text=text[:16000])
        ring.finish(pair)
        del pair, body, text
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert ring.bytes <= bound and grown <= bound, (shape, grown)
    last = ring.since(0)["pairs"][-1]["request"]
    assert len(last.get("messages", [])) <= MESSAGES_KEPT
    if shape == "system floods":
        assert [m["role"] for m in last["messages"]][-1] == "user"
