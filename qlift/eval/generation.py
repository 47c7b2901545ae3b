"""What a backend is asked for and returns, and the on-disk cache of generations.

A generation is keyed by (model content hash, backend, prompt, reference, sampling), so a
rerun of the same evaluation with another gate or report reads everything from disk.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlift.eval.prompts import Example

if TYPE_CHECKING:
    from qlift.eval.backend import Backend
from qlift.fsutil import write_json_atomic
from qlift.models.ref import ModelRef
from qlift.progress import bar


@dataclass(frozen=True)
class Sampling:
    """Decoding settings; greedy so candidate and baseline are compared like for like."""

    max_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0


@dataclass
class Request:
    """One example as a backend sees it."""

    messages: list[dict[str, str]] | None
    prompt: str | None
    reference: str | None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    @classmethod
    def of(cls, ex: Example) -> Request:
        msgs = [m.model_dump() for m in ex.messages] if ex.messages is not None else None
        return cls(messages=msgs, prompt=ex.prompt, reference=ex.reference, tools=ex.tools,
                   tool_choice=ex.tool_choice)


@dataclass
class Generation:
    """A model's greedy answer to one request, and how likely it found the reference."""

    text: str
    output_tokens: int
    latency_s: float
    finish_reason: str | None = None
    ref_logprob: float | None = None  # sum of the reference tokens' log-probabilities
    ref_tokens: int | None = None
    # (name, arguments) each, from an endpoint's message.tool_calls; offline backends leave calls in the text
    tool_calls: list[tuple[str, str | None]] = field(default_factory=list)


OnResult = Callable[[int, Generation], None]
"""Called with (index in the request list, answer) as each answer arrives, by backends that
answer one request at a time (the endpoint), so a failure later keeps what came before."""


@dataclass
class EvalModel:
    """A model under evaluation: a local directory (``ref``, its ``ModelRef``), or a name served
    at an endpoint. ``path`` and ``content_hash`` are the local model's ``ref.base`` and
    ``ref.content_hash``, as the report writes them; ``ref`` itself stays out of the JSON."""

    role: str
    name: str
    path: Path | None = field(init=False, default=None)
    content_hash: str | None = field(init=False, default=None)
    endpoint: str | None = None
    served_identity: str | None = None  # endpoint + name + the model path the server reports
    engine_args: dict[str, Any] = field(default_factory=dict)  # vLLM engine arguments it ran with (--set)
    ref: ModelRef | None = field(default=None, metadata={"json": False})

    def __post_init__(self) -> None:
        if self.ref is not None:
            self.path, self.content_hash = self.ref.base, self.ref.content_hash

    @property
    def cache_id(self) -> str | None:
        """Identity for the cache: the content hash of a local model; for an endpoint, what the
        server says it serves (its URL, the served name and the model path or root it reports),
        so a rerun after a failure asks only for what is missing."""
        base = self.content_hash or self.served_identity
        if base is None or not self.engine_args:
            return base
        # the same checkpoint run with e.g. an FP8 KV cache answers differently: its own cache entries
        return base + "+" + json.dumps(self.engine_args, sort_keys=True)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    backend_runs: int = 0
    shared_models: list[str] = field(default_factory=list)
    load: dict[str, float] = field(default_factory=dict)  # role -> mean 1-min load average while it generated
    numerics: dict[str, str] = field(default_factory=dict)  # role -> engine, device and dtype it generated with


def cache_key(model_id: str, backend: str, req: Request, sampling: Sampling, numerics: str = "") -> str:
    request = {k: v for k, v in asdict(req).items() if v is not None or k not in ("tools", "tool_choice")}
    key: dict[str, Any] = {"model": model_id, "backend": backend, "request": request, "sampling": asdict(sampling)}
    if numerics:
        key["numerics"] = numerics
    blob = json.dumps(key, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class GenerationCache:
    """One small JSON file per generation under ``root``; writes are atomic renames."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> Generation | None:
        if self.root is None:
            return None
        p = self._path(key)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            return Generation(**data)
        except (OSError, ValueError, TypeError):
            return None  # missing or unreadable: generate again

    def put(self, key: str, gen: Generation) -> None:
        if self.root is None:
            return
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(p, asdict(gen), indent=None)


def cached_generate(
    models: list[EvalModel],
    requests: list[Request],
    sampling: Sampling,
    backend: Backend,
    cache: GenerationCache,
) -> tuple[dict[str, list[Generation]], CacheStats]:
    """Generations per model role: from the cache where possible, else from ``backend``.

    Models with one content hash are generated once and shared.
    """
    stats = CacheStats()
    out: dict[str, list[Generation]] = {}
    by_hash: dict[str, str] = {}
    for model in bar(models, total=len(models), desc="models", unit="model"):
        backend.identify(model)
        cid = model.cache_id
        if cid is not None and cid in by_hash:
            out[model.role] = out[by_hash[cid]]
            stats.shared_models.append(model.role)
            continue
        numerics = backend.numerics(model)
        if numerics:
            stats.numerics[model.role] = numerics
        keys = [cache_key(cid, backend.name, r, sampling, numerics) if cid else "" for r in requests]
        gens: list[Generation | None] = [cache.get(k) if cid else None for k in keys]
        missing = [i for i, g in enumerate(gens) if g is None]
        stats.hits += len(requests) - len(missing)
        stats.misses += len(missing)
        if missing:
            stats.backend_runs += 1

            def keep(j: int, g: Generation, model_id: str | None = cid, keys: list[str] = keys,
                     missing: list[int] = missing) -> None:
                if model_id:
                    cache.put(keys[missing[j]], g)

            before = os.getloadavg()[0]
            fresh = backend.generate(model, [requests[i] for i in missing], sampling, on_result=keep)
            stats.load[model.role] = round((before + os.getloadavg()[0]) / 2, 2)
            for i, g in zip(missing, fresh, strict=True):
                gens[i] = g
                if cid:
                    cache.put(keys[i], g)
        out[model.role] = [g for g in gens if g is not None]
        if cid is not None:
            by_hash[cid] = model.role
    return out, stats
