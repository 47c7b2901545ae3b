"""The endpoint backend: any OpenAI-compatible server (a served vLLM, for instance).

Answers come from ``/v1/chat/completions`` (``messages``) or ``/v1/completions``
(``prompt``), greedy. Perplexity needs the prompt exactly as the server renders it, so it
uses vLLM's ``/tokenize`` (chat template applied server-side) and then
``/v1/completions`` with the token ids, ``echo`` and ``logprobs=0`` to read the
reference tokens' log-probabilities. A server without ``/tokenize`` gives no perplexity.

A flaky server costs little: 429, 5xx and connection errors are retried with backoff (a
few times, bounded), each answer is handed to the cache as it arrives, and Ctrl-C or
SIGTERM returns at once even while requests hang (see ``qlift.threads``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from qlift import httpclient, progress
from qlift.errors import ExternalToolError
from qlift.eval.backend import Backend
from qlift.eval.generation import EvalModel, Generation, OnResult, Request, Sampling
from qlift.progress import ProgressLines, bar
from qlift.quality.toolcalls import calls_of
from qlift.threads import map_unordered
from qlift.vllm.client import MODELS_PATH, ServedModel, model_entries

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
RETRIES = 4  # attempts after the first
BACKOFF_S = 0.5  # doubled each attempt: 0.5, 1, 2, 4 s
MAX_RETRY_AFTER_S = 30.0


class EndpointBackend(Backend):
    name = "endpoint"

    def __init__(self, *, concurrency: int = 1, timeout_s: float = 300.0, api_key: str | None = None,
                 retries: int = RETRIES, backoff_s: float = BACKOFF_S) -> None:
        self.concurrency = max(1, concurrency)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.supports_ppl = True  # until a server says otherwise

    def _client(self, model: EvalModel) -> httpx.Client:
        assert model.endpoint is not None
        return httpclient.client(base_url=model.endpoint.rstrip("/"), timeout=self.timeout_s, headers=self.headers)

    def identify(self, model: EvalModel) -> None:
        """Check the server serves ``model.name`` and record what it says it is (for the cache)."""
        with self._client(model) as client:
            served = self._check_model(client, model)
        if served is not None:
            root = served.root or served.id
            model.served_identity = f"endpoint:{model.endpoint}#{model.name}@{root}"

    def generate(self, model: EvalModel, requests: list[Request], sampling: Sampling,
                 on_result: OnResult | None = None) -> list[Generation]:
        out: list[Generation | None] = [None] * len(requests)
        desc = f"endpoint {model.role}"
        log.info("%s: asking %s (%s) for %d answers, %d at a time", desc, model.endpoint, model.name,
                 len(requests), self.concurrency)
        lines = None if progress.enabled() else ProgressLines(desc, len(requests), unit="answers")
        with self._client(model) as client:
            answers = map_unordered(lambda r: self._one(client, model, r, sampling), requests,
                                    workers=self.concurrency, name="qlift-eval")
            for i, gen in bar(answers, total=len(requests), desc=desc):
                out[i] = gen
                if on_result is not None:
                    on_result(i, gen)
                if lines is not None:
                    lines.step()
        return [g for g in out if g is not None]

    def _send(self, client: httpx.Client, model: EvalModel, method: str, path: str,
              body: dict[str, Any] | None = None) -> httpx.Response:
        """One request, retried on 429/5xx/connection errors with backoff; the last answer or error wins."""
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                resp = client.request(method, path, json=body)
            except httpx.HTTPError as exc:
                if path == MODELS_PATH and isinstance(exc, httpx.ConnectError):
                    raise ExternalToolError(  # nothing listens there: not worth a retry
                        f"cannot reach {model.endpoint}: {type(exc).__name__}: {exc}",
                        hint="Start the server, or fix --endpoint.", tool="endpoint",
                    ) from exc
                if last:
                    raise ExternalToolError(
                        f"request to {model.endpoint}{path} failed after {attempt + 1} tries: "
                        f"{type(exc).__name__}: {exc}",
                        hint="Check that the server is up and --endpoint is right; a rerun asks only for "
                             "the answers still missing.", tool="endpoint",
                    ) from exc
                wait = self.backoff_s * 2**attempt
                log.debug("%s%s: %s; retrying in %.1f s", model.endpoint, path, type(exc).__name__, wait)
            else:
                if resp.status_code not in RETRY_STATUS or last:
                    return resp
                wait = _retry_after(resp) or self.backoff_s * 2**attempt
                log.debug("%s%s: HTTP %d; retrying in %.1f s", model.endpoint, path, resp.status_code, wait)
            time.sleep(wait)
        raise AssertionError("unreachable")

    def _post(self, client: httpx.Client, model: EvalModel, path: str, body: dict[str, Any]) -> Any:
        resp = self._send(client, model, "POST", path, body)
        if resp.status_code != 200:
            hint = "Check --model against the server's /v1/models."
            if resp.status_code in RETRY_STATUS:
                hint = "The server kept failing; a rerun asks only for the answers still missing."
            raise ExternalToolError(
                f"{model.endpoint}{path} answered HTTP {resp.status_code}: {resp.text[:300]}",
                hint=hint, tool="endpoint",
            )
        return _json(resp, model, path)

    def _check_model(self, client: httpx.Client, model: EvalModel) -> ServedModel | None:
        resp = self._send(client, model, "GET", MODELS_PATH)
        if resp.status_code != 200:
            return None
        try:
            entries = model_entries(_json(resp, model, MODELS_PATH))
        except ValueError:
            raise ExternalToolError(
                f"{model.endpoint}/v1/models did not answer an OpenAI model list",
                hint="The endpoint must speak the OpenAI API; check --endpoint.", tool="endpoint",
            ) from None
        served = {m.id: m for m in entries}
        if model.name not in served:
            raise ExternalToolError(
                f"{model.endpoint} does not serve a model named '{model.name}' (it serves: {', '.join(served)})",
                hint="Pass the served name with --model / --baseline.", tool="endpoint",
            )
        return served[model.name]

    def _one(self, client: httpx.Client, model: EvalModel, req: Request, sampling: Sampling) -> Generation:
        try:
            return self._answer(client, model, req, sampling)
        except (KeyError, IndexError, TypeError, ValueError) as exc:  # not the OpenAI response shape
            raise ExternalToolError(
                f"{model.endpoint} gave an unexpected response: {type(exc).__name__}: {exc}",
                hint="The endpoint must speak the OpenAI completions API.", tool="endpoint",
            ) from exc

    def _answer(self, client: httpx.Client, model: EvalModel, req: Request, sampling: Sampling) -> Generation:
        body: dict[str, Any] = {
            "model": model.name, "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "seed": sampling.seed,
        }
        t0 = time.monotonic()
        calls: list[tuple[str, str | None]] = []
        if req.messages is not None:
            tools = {k: v for k, v in (("tools", req.tools), ("tool_choice", req.tool_choice)) if v is not None}
            data = self._post(client, model, "/v1/chat/completions", {**body, "messages": req.messages, **tools})
            message = data["choices"][0]["message"]
            text = message["content"] or ""
            calls = list(calls_of(message.get("tool_calls")))
        else:
            data = self._post(client, model, "/v1/completions", {**body, "prompt": req.prompt})
            text = data["choices"][0]["text"]
        latency = time.monotonic() - t0
        usage = data.get("usage") or {}
        gen = Generation(
            text=text, output_tokens=int(usage.get("completion_tokens", 0)), latency_s=latency,
            finish_reason=data["choices"][0].get("finish_reason"), tool_calls=calls,
        )
        if req.reference and self.supports_ppl:
            self._score(client, model, req, gen)
        return gen

    def _score(self, client: httpx.Client, model: EvalModel, req: Request, gen: Generation) -> None:
        tok_body: dict[str, Any] = {"model": model.name}
        if req.messages is not None:
            tok_body |= {"messages": req.messages, "add_generation_prompt": True}
        else:
            tok_body |= {"prompt": req.prompt}
        resp = self._send(client, model, "POST", "/tokenize", tok_body)
        if resp.status_code == 404:
            log.warning("%s has no /tokenize: no perplexity from this endpoint", model.endpoint)
            self.supports_ppl = False
            return
        if resp.status_code != 200:
            raise ExternalToolError(
                f"{model.endpoint}/tokenize answered HTTP {resp.status_code}: {resp.text[:300]}", tool="endpoint"
            )
        prompt_ids = _json(resp, model, "/tokenize")["tokens"]
        ref_ids = self._post(
            client, model, "/tokenize",
            {"model": model.name, "prompt": req.reference, "add_special_tokens": False},
        )["tokens"]
        data = self._post(client, model, "/v1/completions", {
            "model": model.name, "prompt": prompt_ids + ref_ids, "max_tokens": 1,
            "temperature": 0, "echo": True, "logprobs": 0,
        })
        lps = data["choices"][0]["logprobs"]["token_logprobs"]
        ref_lps = lps[len(prompt_ids) : len(prompt_ids) + len(ref_ids)]
        if len(ref_lps) != len(ref_ids) or any(v is None for v in ref_lps):
            raise ExternalToolError(
                f"{model.endpoint} returned {len(lps)} echoed log-probabilities for "
                f"{len(prompt_ids) + len(ref_ids)} prompt tokens", tool="endpoint",
                hint="The server must support echo with logprobs on /v1/completions for perplexity.",
            )
        gen.ref_logprob = float(sum(ref_lps))
        gen.ref_tokens = len(ref_ids)


def _json(resp: httpx.Response, model: EvalModel, path: str) -> Any:
    try:
        return resp.json()
    except ValueError as exc:
        raise ExternalToolError(
            f"{model.endpoint}{path} answered with something that is not JSON: {resp.text[:120]!r}",
            hint="The endpoint must speak the OpenAI API; check --endpoint.", tool="endpoint",
        ) from exc


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        value = float(resp.headers.get("retry-after", ""))
    except ValueError:
        return None
    return min(max(value, 0.0), MAX_RETRY_AFTER_S)
