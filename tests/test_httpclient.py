"""qlift's HTTP calls share one TLS context: the calls a controller makes every window build none of their own
(httpx builds one per client, ~20 ms of CPU loading certifi's bundle, plain http:// included)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from faults import RouterProcess, TinyBackend


@pytest.fixture
def contexts_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from qlift import httpclient

    httpclient.tls_context()  # the one shared context, built before counting
    built: list[int] = []
    real = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    return built


def test_router_admin_and_vllm_calls_build_no_tls_context(contexts_built: list[int], tmp_path: Path) -> None:
    import httpx

    from qlift.router.client import RouterClient
    from qlift.vllm.client import VllmClient

    with TinyBackend("tiny") as backend, RouterProcess("--backend", f"stable={backend.url}",
                                                       log_path=tmp_path / "router.log", token="t0k") as router:
        admin = RouterClient(router.url, "t0k")
        for _ in range(5):
            assert admin.state().weights == {"stable": 100}
            assert admin.requests(since=0).requests == []
        vllm = VllmClient(backend.url)
        assert all(vllm.request("GET", "/v1/models").status_code == 200 for _ in range(5))
        assert contexts_built == []
        httpx.get(f"{backend.url}/health", timeout=10)  # what each call cost before: a context of its own
    assert contexts_built == [1]
