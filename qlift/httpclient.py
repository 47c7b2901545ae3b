"""httpx calls that share one TLS context.

httpx builds an SSL context for every client, and a module-level ``httpx.get`` is a client of its own: loading
certifi's bundle costs ~20 ms of CPU each time, plain ``http://`` included. A rollout controller polling its router
and vLLM's /metrics several times a window paid that on every call (a quarter of the CPU of a promotion over
scripted backends). The context is built once, the way httpx builds it (``SSL_CERT_FILE`` / ``SSL_CERT_DIR``
honoured), and every call here passes it.
"""

from __future__ import annotations

import ssl
from functools import lru_cache
from typing import Any

import httpx


@lru_cache(maxsize=1)
def tls_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.request`` with the shared TLS context (a new connection each call, as before)."""
    return httpx.request(method, url, verify=tls_context(), **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return request("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return request("POST", url, **kwargs)


def client(**kwargs: Any) -> httpx.Client:
    """``httpx.Client`` with the shared TLS context."""
    return httpx.Client(verify=tls_context(), **kwargs)


def async_client(**kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=tls_context(), **kwargs)
