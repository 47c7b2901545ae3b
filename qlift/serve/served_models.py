"""A running vLLM server's ``/v1/models``, and the one way qlift calls its HTTP API (`qlift lora` and the slot
count both read it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from qlift.errors import BadInputError, ExternalToolError


@dataclass
class ServedModel:
    """One entry of a vLLM server's /v1/models."""

    id: str
    root: str | None
    parent: str | None  # set for an adapter: its base's served name

    @property
    def is_adapter(self) -> bool:
        return self.parent is not None


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def server_url(server: str) -> str:
    return server.rstrip("/").removesuffix("/v1")


def request(method: str, server: str, path: str, *, api_key: str | None, json: Any = None,
            timeout: float = 10.0) -> httpx.Response:
    try:
        return httpx.request(method, server_url(server) + path, json=json, headers=_headers(api_key), timeout=timeout)
    except httpx.HTTPError as exc:
        raise ExternalToolError(f"cannot reach the vLLM server at {server_url(server)} ({type(exc).__name__}: {exc})",
                                hint="Check --server and that the server is up.", tool="vllm") from None


def served_models(server: str, *, api_key: str | None = None) -> list[ServedModel]:
    resp = request("GET", server, "/v1/models", api_key=api_key)
    if resp.status_code == 401:
        raise BadInputError(f"{server_url(server)} wants an API key", field="--api-key-env",
                            hint="Pass --api-key-env NAME with the server's key.")
    try:
        resp.raise_for_status()
        return [ServedModel(id=str(m["id"]), root=m.get("root"), parent=m.get("parent"))
                for m in resp.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise ExternalToolError(f"{server_url(server)}/v1/models did not answer a model list ({exc})",
                                hint="Is it a vLLM server?", tool="vllm") from None
