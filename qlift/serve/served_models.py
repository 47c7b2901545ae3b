"""A running vLLM server's ``/v1/models`` as `qlift lora` and the slot count read it: through the vLLM client,
with a 401 named as the flag that fixes it."""

from __future__ import annotations

from qlift.errors import BadInputError
from qlift.vllm.client import ServedModel, ServerRefused, VllmClient, server_url

__all__ = ["ServedModel", "served_models", "server_url"]


def served_models(server: str, *, api_key: str | None = None) -> list[ServedModel]:
    try:
        return VllmClient(server, api_key=api_key).models()
    except ServerRefused as exc:
        if exc.status == 401:
            raise BadInputError(f"{server_url(server)} wants an API key", field="--api-key-env",
                                hint="Pass --api-key-env NAME with the server's key.") from None
        raise
