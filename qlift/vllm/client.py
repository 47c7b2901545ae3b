"""A running vLLM server's HTTP API, the one way qlift asks it: the models it serves (``/v1/models``), its
Prometheus ``/metrics``, and runtime LoRA adapters (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``).

Failures are ``VllmError`` (an ``ExternalToolError``) subclasses that keep what went wrong: the httpx error as
``cause``, the HTTP status. Their messages are those of `qlift lora`; a caller that words its own (bench, eval,
preflight) catches the subclass it cares about. The API key travels only in the Authorization header.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from qlift import httpclient
from qlift.errors import ExternalToolError

MODELS_PATH = "/v1/models"
METRICS_PATH = "/metrics"
ADAPTER_LOAD_TIMEOUT_S = 120.0  # a load reads the adapter's weights into the engine
PROCESS_START = "process_start_time_seconds"
LORA_INFO = "vllm:lora_requests_info"
GENERATION_TOKENS = "vllm:generation_tokens_total"


def server_url(url: str) -> str:
    """``http://h:p`` from ``http://h:p``, ``http://h:p/``, ``http://h:p/v1`` or ``http://h:p#MODEL``."""
    return url.partition("#")[0].rstrip("/").removesuffix("/v1")


class VllmError(ExternalToolError):
    """The server did not answer as vLLM does. ``cause``: the httpx error behind it, where there is one."""

    def __init__(self, message: str, *, hint: str | None = None, cause: Exception | None = None) -> None:
        super().__init__(message, hint=hint, tool="vllm")
        self.cause = cause

    @property
    def reason(self) -> str:
        """The cause's own text (httpx's, or the parser's), without this error's wording around it."""
        return str(self.cause) if self.cause is not None else self.message


class ServerUnreachable(VllmError):
    """No answer at all: refused, reset, timed out."""


class ServerRefused(VllmError):
    """An answer with an HTTP status other than 200."""

    def __init__(self, message: str, *, status: int, hint: str | None = None, cause: Exception | None = None) -> None:
        super().__init__(message, hint=hint, cause=cause)
        self.status = status


class NotAModelList(VllmError):
    """``/v1/models`` answered 200 with something other than an OpenAI model list."""


class NotPrometheusText(VllmError):
    """``/metrics`` answered 200 with something the Prometheus text parser refuses."""


@dataclass(frozen=True)
class ServedModel:
    """One entry of a vLLM server's /v1/models."""

    id: str
    root: str | None = None  # the path or repo it loaded (an adapter: the adapter's dir)
    parent: str | None = None  # set for an adapter: its base's served name
    max_model_len: int | None = None
    owned_by: str | None = None  # "vllm" on a vLLM server

    @property
    def is_adapter(self) -> bool:
        return self.parent is not None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def model_entries(body: Any) -> list[ServedModel]:
    """The entries of a parsed /v1/models body; entries without a string ``id`` are left out. ValueError when
    it is not ``{"data": [...]}``."""
    entries = body.get("data") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        raise ValueError("no 'data' list")
    return [ServedModel(id=m["id"], root=_text(m.get("root")), parent=_text(m.get("parent")),
                        max_model_len=_int(m.get("max_model_len")),
                        owned_by=_text(m.get("owned_by")))
            for m in entries if isinstance(m, dict) and isinstance(m.get("id"), str)]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def _family_name(line: str) -> str:
    """The metric a line is about: a ``# HELP``/``# TYPE`` line's name, else the line itself (a sample)."""
    return line.split(" ", 3)[2] if line.startswith("# ") and line.count(" ") >= 2 else line


@dataclass(frozen=True)
class Metrics:
    """One /metrics page's samples, with the readings qlift takes from it."""

    samples: tuple[Sample, ...] = ()

    def series(self, name: str, **match: str) -> list[Sample]:
        return [s for s in self.samples
                if s.name == name and all(s.labels.get(k) == want for k, want in match.items())]

    def total(self, name: str, **match: str) -> float | None:
        """The sum over ``name``'s series whose labels match (engines, models); None when it has none."""
        found = self.series(name, **match)
        return sum(s.value for s in found) if found else None

    @property
    def process_start_time(self) -> float | None:
        """The server process's start (a restart changes it: another instance)."""
        found = self.series(PROCESS_START)
        return found[0].value if found else None

    @property
    def max_loras(self) -> int | None:
        """The engine's adapter slots (``max_lora`` on lora_requests_info, written at its first engine step)."""
        for s in self.series(LORA_INFO):
            value = s.labels.get("max_lora", "")
            if value.isdigit():
                return int(value)
        return None

    @property
    def generation_tokens(self) -> float | None:
        return self.total(GENERATION_TOKENS)


def parse_prometheus(text: str, *, only: Sequence[str] = ()) -> Metrics:
    """The samples of a Prometheus text page; with ``only``, just the families whose names start with one of
    them (vLLM's page is large: parsing all of it costs a loaded core tenths of a second). ValueError when the
    text (what is kept of it) is not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    if only:
        prefixes = tuple(only)
        text = "\n".join(line for line in text.splitlines() if _family_name(line).startswith(prefixes)) + "\n"
    return Metrics(tuple(Sample(s.name, s.labels, s.value)
                         for family in text_string_to_metric_families(text) for s in family.samples))


@dataclass(frozen=True)
class AdapterReply:
    """What the server answered a load or unload."""

    status: int
    error: str  # its error message (the OpenAI error body's, or the text's start); "" when it succeeded
    runtime_off: bool  # a bare 404/405 (no OpenAI error body): runtime LoRA updating is off

    @property
    def ok(self) -> bool:
        return self.status < 400

    @classmethod
    def of(cls, resp: httpx.Response) -> AdapterReply:
        return cls(resp.status_code, error_text(resp) if resp.status_code >= 400 else "", _runtime_off(resp))


def error_text(resp: httpx.Response) -> str:
    """The error a server answered: an OpenAI error body's message, a FastAPI detail, or the text's start."""
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:200]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        return str(data.get("detail") or data.get("message") or data)[:300]
    return str(data)[:300]


def _runtime_off(resp: httpx.Response) -> bool:
    """vLLM answers a bare 404 (no OpenAI error body) when runtime LoRA updating is off."""
    try:
        return resp.status_code in (404, 405) and "error" not in resp.json()
    except ValueError:
        return resp.status_code in (404, 405)


def _status_error(resp: httpx.Response) -> httpx.HTTPStatusError:
    try:
        resp.raise_for_status()
    except httpx.HTTPStatusError as exc:
        return exc
    return httpx.HTTPStatusError(f"HTTP {resp.status_code}", request=resp.request, response=resp)


@dataclass(frozen=True)
class VllmClient:
    """A vLLM server at ``url`` (``/v1`` and a ``#MODEL`` fragment are dropped). ``http``: a client to reuse
    across calls (a poller's); otherwise each call opens its own connection."""

    url: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 10.0
    http: httpx.Client | None = field(default=None, repr=False, compare=False)

    @property
    def base(self) -> str:
        return server_url(self.url)

    def request(self, method: str, path: str, *, json: Any = None, timeout_s: float | None = None) -> httpx.Response:
        """One call; ServerUnreachable when nothing answers. Any status comes back (the caller reads it)."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            if self.http is not None:
                return self.http.request(method, self.base + path, json=json, headers=headers, timeout=timeout)
            return httpclient.request(method, self.base + path, json=json, headers=headers, timeout=timeout)
        except httpx.HTTPError as exc:
            raise ServerUnreachable(f"cannot reach the vLLM server at {self.base} ({type(exc).__name__}: {exc})",
                                    hint="Check --server and that the server is up.", cause=exc) from None

    def _get_ok(self, path: str, what: str, timeout_s: float | None) -> httpx.Response:
        resp = self.request("GET", path, timeout_s=timeout_s)
        if resp.status_code != 200:
            cause = _status_error(resp)
            raise ServerRefused(f"{self.base}{path} did not answer {what} ({cause})", status=resp.status_code,
                                hint="Is it a vLLM server?", cause=cause) from None
        return resp

    def models(self, *, timeout_s: float | None = None) -> list[ServedModel]:
        """What ``/v1/models`` lists: bases and adapters."""
        resp = self._get_ok(MODELS_PATH, "a model list", timeout_s)
        try:
            return model_entries(resp.json())
        except (ValueError, RecursionError) as exc:
            raise NotAModelList(f"{self.base}{MODELS_PATH} did not answer a model list ({exc})",
                                hint="Is it a vLLM server?", cause=exc) from None

    def metrics(self, *, only: Sequence[str] = (), timeout_s: float | None = None) -> Metrics:
        """``/metrics``, parsed once (``only``: the families wanted, as ``parse_prometheus`` takes them)."""
        resp = self._get_ok(METRICS_PATH, "Prometheus metrics", timeout_s)
        try:
            return parse_prometheus(resp.text, only=only)
        except ValueError as exc:
            raise NotPrometheusText(f"{self.base}{METRICS_PATH} did not answer Prometheus metrics ({exc})",
                                    hint="Is it a vLLM server?", cause=exc) from None

    def load_adapter(self, name: str, path: str | Path, *,
                     timeout_s: float = ADAPTER_LOAD_TIMEOUT_S) -> AdapterReply:
        return AdapterReply.of(self.request("POST", "/v1/load_lora_adapter", timeout_s=timeout_s,
                                            json={"lora_name": name, "lora_path": str(path)}))

    def unload_adapter(self, name: str, *, timeout_s: float | None = None) -> AdapterReply:
        return AdapterReply.of(self.request("POST", "/v1/unload_lora_adapter", timeout_s=timeout_s,
                                            json={"lora_name": name}))
