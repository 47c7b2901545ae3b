"""The gateway's filter and token limit on every route the router proxies (issue 29): the filter reads
every string of a body and refuses numbers where a prompt goes; every usage shape is billed, and an
answer without usage is billed its request's output limit. Real `qlift router` processes on
127.0.0.1 in front of ScriptedBackend, which records every body it gets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from faults import RouterProcess
from router_backends import ScriptedBackend

from qlift import httpclient
from qlift.router.limits import tokens_used

TOKEN = "admin-secret"
WORD = "bomb"

# (route, body): a blocked word in a field the old field-by-field lists did not read.
BLOCKED_BODIES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/messages", {"max_tokens": 4, "system": [{"type": "text", "text": "a bomb"}],
                      "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "the bomb"}]}]}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "the bomb"}]}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"what": "a bomb"}}]}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"bomb": 1}}]}]}),
    ("/v1/score", {"text_1": "hi", "text_2": ["fine", "a bomb"]}),
    ("/v1/score", {"text_1": "a bomb", "text_2": "hi"}),
    ("/score", {"queries": ["a bomb"], "documents": ["x"]}),
    ("/v1/rerank", {"query": "a bomb", "documents": ["x"]}),
    ("/v1/rerank", {"query": "q", "documents": ["x", "bomb"]}),
    ("/rerank", {"query": "q", "documents": [{"text": "bomb"}]}),
    ("/v2/embed", {"texts": ["fine", "bomb"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "documents": [{"title": "t", "text": "a bomb"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"persona": "a bomb maker"}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"bomb": True}}),  # keys are rendered too
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "chat_template": "{{ 'bomb' }}{{ messages }}"}),
    ("/v1/responses", {"input": [{"type": "function_call_output", "call_id": "c", "output": {"x": "bomb"}}]}),
    ("/pooling", {"input": {"nested": ["bomb"]}}),
    ("/classify", {"input": ["fine", "bomb"]}),
    ("/tokenize", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"x": {"y": "bomb"}}]}),
]
# Token ids however spelled: vLLM's lax pydantic reads floats and booleans as ids.
NUMERIC_BODIES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"prompt": [9906.0, 1917.0]}),
    ("/v1/completions", {"prompt": [True, 9906]}),
    ("/v1/completions", {"prompt": ["fine", 9906]}),
    ("/v1/completions", {"prompt": [[9906.0], [1917]]}),
    ("/v1/embeddings", {"input": [9906.0, 1917.0]}),
    ("/v1/embeddings", {"input": [True, False]}),
    ("/v1/embeddings", {"input": 9906}),
    ("/tokenize", {"prompt": [1.0, 2.0]}),
    ("/v1/score", {"text_1": [1.0], "text_2": "x"}),
    ("/v2/embed", {"texts": [9906.0]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [9906, 1917]}]}),
]


@pytest.fixture(scope="module")
def filtered(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("every-route")
    (root / "blocked.txt").write_text(f"{WORD}\n")
    (root / "router.yaml").write_text("filter_file: blocked.txt\n")
    with ScriptedBackend("m", any_route=True) as backend, RouterProcess(
            "--backend", f"only={backend.url}", "--public-model", "pub", "--config", root / "router.yaml",
            log_path=root / "router.log", token=TOKEN) as router:
        yield router, backend


@pytest.mark.parametrize("route,body", BLOCKED_BODIES + NUMERIC_BODIES,
                         ids=[f"{r}-{i}" for i, (r, _) in enumerate(BLOCKED_BODIES + NUMERIC_BODIES)])
def test_the_filter_reads_every_field_of_every_route(filtered, route: str, body: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    router, backend = filtered
    seen = len(backend.bodies)
    r = httpclient.post(router.url + route, json={"model": "pub", **body}, timeout=30)
    assert r.status_code == 400, (route, body, r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] == "content_filter" and error["type"] == "invalid_request_error", error
    assert WORD not in error["message"]
    assert len(backend.bodies) == seen, backend.bodies[seen:]  # the backend never saw it


def test_clean_bodies_on_those_routes_pass(filtered) -> None:  # type: ignore[no-untyped-def]
    router, backend = filtered
    for route, body in BLOCKED_BODIES:
        clean = json.loads(json.dumps(body).replace(WORD, "cake"))
        r = httpclient.post(router.url + route, json={"model": "pub", **clean}, timeout=30)
        assert r.status_code == 200, (route, r.text)
    assert WORD not in json.dumps(backend.bodies)
    r = httpclient.post(router.url + "/v1/completions", json={"model": "pub", "prompt": ["fine", "words"]}, timeout=30)
    assert r.status_code == 200


# -- billing ---------------------------------------------------------------------------------


def test_every_usage_shape_is_read() -> None:
    from qlift.router.proxy import Attempt

    shapes: list[tuple[dict[str, Any], tuple[int | None, int | None]]] = [
        ({"usage": {"prompt_tokens": 3, "completion_tokens": 7}}, (3, 7)),
        ({"usage": {"input_tokens": 4, "output_tokens": 9}}, (4, 9)),  # Responses, Messages: whole answer
        ({"type": "response.completed", "response": {"usage": {"input_tokens": 5, "output_tokens": 11}}}, (5, 11)),
        ({"type": "message_start", "message": {"usage": {"input_tokens": 6, "output_tokens": 1}}}, (6, 1)),
        ({"type": "message_delta", "usage": {"output_tokens": 12}}, (None, 12)),
    ]
    for event, expected in shapes:
        att = Attempt("b", stream=True)
        att.take_event(event)
        assert (att.prompt_tokens, att.completion_tokens) == expected, event
    # A whole answer without usage pays its output limit; one the client left pays what it streamed.
    assert tokens_used(10, None, None, 0, completed=True, max_output=500) == 510
    assert tokens_used(10, None, 1, 40, completed=False, max_output=500) == 50
    assert tokens_used(10, 5, 20, 3, completed=True, max_output=500) == 25


@pytest.mark.parametrize("route,stream,usage", [
    ("/v1/responses", False, True), ("/v1/responses", True, True), ("/v1/messages", False, True),
    ("/v1/messages", True, True), ("/v1/messages", False, False), ("/v1/responses", True, False)])
def test_the_token_limit_holds_on_responses_and_messages(tmp_path: Path, route: str, stream: bool,
                                                         usage: bool) -> None:
    """Eight 1,000-token answers went through a 3,000 tokens/min budget that stops chat after 3."""
    cfg = tmp_path / "router.yaml"
    cfg.write_text("limits: {tokens_per_min: 3000}\n")
    with ScriptedBackend("m", tokens=1000, usage=usage) as backend, RouterProcess(
            "--backend", f"only={backend.url}", "--public-model", "pub", "--config", cfg,
            log_path=tmp_path / "router.log", token=TOKEN) as router:
        body: dict[str, Any] = {"model": "pub", "stream": stream, "max_tokens" if route == "/v1/messages"
                                else "max_output_tokens": 1000}
        body["messages" if route == "/v1/messages" else "input"] = [{"role": "user", "content": "tell me a story"}]
        statuses = [httpclient.post(router.url + route, json=body, timeout=30).status_code for _ in range(8)]
        assert statuses.count(200) <= 4 and statuses.count(429) >= 3, statuses  # 50 tokens/s refill meanwhile
        records = router.admin().requests().requests
        if usage:
            assert all(r.completion_tokens == 1000 for r in records), records
