"""The endpoint backend: any OpenAI-compatible server (a served vLLM, for instance).

Answers come from ``/v1/chat/completions`` (``messages``) or ``/v1/completions``
(``prompt``), greedy. Perplexity needs the prompt exactly as the server renders it, so it
uses vLLM's ``/tokenize`` (chat template applied server-side) and then
``/v1/completions`` with the token ids, ``echo`` and ``logprobs=0`` to read the
reference tokens' log-probabilities. A server without ``/tokenize`` gives no perplexity.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from qlift.errors import ExternalToolError
from qlift.eval.generation import Generation, ModelRef, Request, Sampling
from qlift.progress import bar

log = logging.getLogger(__name__)


class EndpointBackend:
    name = "endpoint"

    def __init__(self, *, concurrency: int = 1, timeout_s: float = 300.0, api_key: str | None = None) -> None:
        self.concurrency = max(1, concurrency)
        self.timeout_s = timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.supports_ppl = True  # until a server says otherwise

    def generate(self, model: ModelRef, requests: list[Request], sampling: Sampling) -> list[Generation]:
        assert model.endpoint is not None
        base = model.endpoint.rstrip("/")
        with httpx.Client(base_url=base, timeout=self.timeout_s, headers=self.headers) as client:
            self._check_model(client, model)
            with ThreadPoolExecutor(self.concurrency) as pool:
                futures = [pool.submit(self._one, client, model, r, sampling) for r in requests]
                return [f.result() for f in bar(futures, total=len(futures), desc=f"endpoint {model.role}")]

    def _post(self, client: httpx.Client, model: ModelRef, path: str, body: dict[str, Any]) -> Any:
        try:
            resp = client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise ExternalToolError(
                f"request to {model.endpoint}{path} failed: {type(exc).__name__}: {exc}",
                hint="Check that the server is up and --endpoint is right.", tool="endpoint",
            ) from exc
        if resp.status_code != 200:
            raise ExternalToolError(
                f"{model.endpoint}{path} answered HTTP {resp.status_code}: {resp.text[:300]}",
                hint="Check --model against the server's /v1/models.", tool="endpoint",
            )
        return resp.json()

    def _check_model(self, client: httpx.Client, model: ModelRef) -> None:
        try:
            resp = client.get("/v1/models")
        except httpx.HTTPError as exc:
            raise ExternalToolError(
                f"cannot reach {model.endpoint}: {type(exc).__name__}: {exc}",
                hint="Start the server, or fix --endpoint.", tool="endpoint",
            ) from exc
        if resp.status_code == 200:
            names = [m.get("id") for m in resp.json().get("data", [])]
            if model.name not in names:
                raise ExternalToolError(
                    f"{model.endpoint} does not serve a model named '{model.name}' "
                    f"(it serves: {', '.join(map(str, names))})",
                    hint="Pass the served name with --model / --baseline.", tool="endpoint",
                )

    def _one(self, client: httpx.Client, model: ModelRef, req: Request, sampling: Sampling) -> Generation:
        try:
            return self._answer(client, model, req, sampling)
        except (KeyError, IndexError, TypeError, ValueError) as exc:  # not the OpenAI response shape
            raise ExternalToolError(
                f"{model.endpoint} gave an unexpected response: {type(exc).__name__}: {exc}",
                hint="The endpoint must speak the OpenAI completions API.", tool="endpoint",
            ) from exc

    def _answer(self, client: httpx.Client, model: ModelRef, req: Request, sampling: Sampling) -> Generation:
        body: dict[str, Any] = {
            "model": model.name, "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "seed": sampling.seed,
        }
        t0 = time.monotonic()
        if req.messages is not None:
            data = self._post(client, model, "/v1/chat/completions", {**body, "messages": req.messages})
            text = data["choices"][0]["message"]["content"] or ""
        else:
            data = self._post(client, model, "/v1/completions", {**body, "prompt": req.prompt})
            text = data["choices"][0]["text"]
        latency = time.monotonic() - t0
        usage = data.get("usage") or {}
        gen = Generation(
            text=text, output_tokens=int(usage.get("completion_tokens", 0)), latency_s=latency,
            finish_reason=data["choices"][0].get("finish_reason"),
        )
        if req.reference and self.supports_ppl:
            self._score(client, model, req, gen)
        return gen

    def _score(self, client: httpx.Client, model: ModelRef, req: Request, gen: Generation) -> None:
        tok_body: dict[str, Any] = {"model": model.name}
        if req.messages is not None:
            tok_body |= {"messages": req.messages, "add_generation_prompt": True}
        else:
            tok_body |= {"prompt": req.prompt}
        resp = client.post("/tokenize", json=tok_body)
        if resp.status_code == 404:
            log.warning("%s has no /tokenize: no perplexity from this endpoint", model.endpoint)
            self.supports_ppl = False
            return
        if resp.status_code != 200:
            raise ExternalToolError(
                f"{model.endpoint}/tokenize answered HTTP {resp.status_code}: {resp.text[:300]}", tool="endpoint"
            )
        prompt_ids = resp.json()["tokens"]
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
