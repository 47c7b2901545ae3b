"""``qlift bench``: load an OpenAI-compatible vLLM server at several concurrency levels.

The load is vLLM's own benchmark client (``qlift.perf.bench_worker``); qlift adds the server
check, the time bound, the SLO goodput, the result file with hardware and versions, the plot,
and ratios against a baseline result.
"""

from __future__ import annotations

import json
import logging
import platform
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qlift import __version__
from qlift.errors import BadInputError, ExternalToolError, NotFoundError
from qlift.perf.options import BenchOptions
from qlift.perf.slo import RequestRecord, goodput, vllm_goodput_args
from qlift.vllm.client import NotAModelList, ServerRefused, ServerUnreachable, VllmClient
from qlift.vllm.worker import Worker, run_worker

log = logging.getLogger(__name__)
RESULT_KIND = "qlift-bench/1"
BENCH_WORKER = "qlift.perf.bench_worker"
PERCENTILES = (50, 95, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class LevelResult:
    """One concurrency level: latencies in ms, rates per second."""

    concurrency: int
    requests: int
    completed: int
    failed: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    total_output_tokens: int
    total_input_tokens: int
    latency_ms: dict[str, dict[str, float]]  # metric -> {mean, p50, p95, p99}
    goodput_requests_per_s: float
    goodput_output_tokens_per_s: float
    good_requests: int
    vllm_request_goodput: float | None  # vLLM's own figure, for comparison
    errors: list[str] = field(default_factory=list)  # distinct error messages, at most 5


@dataclass
class BenchResult:
    kind: str
    endpoint: str
    model: str
    tokenizer: str
    date: str
    qlift_version: str
    vllm_version: str | None
    hardware: dict[str, Any]
    server: dict[str, Any]  # what the server says about itself, and its args when qlift started it
    workload: dict[str, Any]
    slo_ms: dict[str, float]
    levels: list[LevelResult]
    complete: bool  # False when the time limit stopped it early
    baseline: dict[str, Any] | None = None  # ratios against --baseline


def api_base(endpoint: str) -> str:
    """``http://h:p`` from ``http://h:p``, ``http://h:p/`` or ``http://h:p/v1``."""
    return endpoint.rstrip("/").removesuffix("/v1")


def server_info(base: str, model: str) -> dict[str, Any]:
    """The server's /v1/models entry for ``model``; raises when it is not up or does not serve it."""
    try:
        models = {m.id: m for m in VllmClient(base, timeout_s=10.0).models()}
    except ServerUnreachable as exc:
        raise ExternalToolError(f"cannot reach {base}/v1/models: {exc.reason}",
                                hint="Start the server first (`qlift serve`) or fix --endpoint.", tool="vllm") from None
    except ServerRefused as exc:
        raise ExternalToolError(f"{base}/v1/models answered HTTP {exc.status}", tool="vllm",
                                hint="Is --endpoint an OpenAI-compatible vLLM server?") from None
    except NotAModelList:
        raise ExternalToolError(f"{base}/v1/models did not answer an OpenAI model list (JSON with 'data': [...])",
                                hint="Is --endpoint an OpenAI-compatible vLLM server?", tool="vllm") from None
    if model not in models:
        raise NotFoundError(f"the server at {base} does not serve '{model}' (it serves: {', '.join(models)})",
                            hint="Pass one of those to --model.")
    entry = models[model]
    return {"root": entry.root, "max_model_len": entry.max_model_len}


def pick_tokenizer(model: str, root: Any) -> str:
    """The tokenizer vLLM's client builds prompts with, found on this machine: the server's model
    directory (its /v1/models ``root``), else that repo (or the served name) in the local hub cache.
    Never the hub itself: a name no cache has would cost minutes of retries and then fail."""
    names = [str(n) for n in (root, model) if isinstance(n, str) and n]
    for name in names:
        if Path(name).is_dir():
            return name
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    for name in names:
        try:
            return str(snapshot_download(name, local_files_only=True))
        except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
            continue
    raise BadInputError(
        f"no tokenizer for '{model}' on this machine (the server's model root {root!r} is not a directory here, "
        "nor a repo in the local hub cache)", field="tokenizer",
        hint="Pass `tokenizer` DIR (the model directory, or a copy of its tokenizer files) or `tokenizer` ORG/REPO.")


def to_level(raw: dict[str, Any], slo: dict[str, float]) -> LevelResult:
    d = raw.get("detail", {})
    ttfts, itls, outs, errs = d.get("ttfts", []), d.get("itls", []), d.get("output_lens", []), d.get("errors", [])
    # vLLM 0.32 reports per-request latencies; 0.26 does not, and ttft + the inter-token gaps is the same time.
    lat = d.get("latencies") or [t + sum(i or []) for t, i in zip(ttfts, itls, strict=False)]
    records = [RequestRecord(ok=not e, ttft=t or 0.0, latency=la or 0.0, output_tokens=int(n or 0))
               for t, la, n, e in zip(ttfts, lat, outs, errs, strict=False)]
    gp = goodput(records, slo, float(raw["duration"]))
    latency = {m: {"mean": float(raw.get(f"mean_{m}_ms") or 0.0),
                   **{f"p{p}": float(raw.get(f"p{p}_{m}_ms") or 0.0) for p in PERCENTILES}} for m in METRICS}
    return LevelResult(
        concurrency=int(raw["concurrency"]), requests=len(records), completed=int(raw["completed"]),
        failed=int(raw.get("failed", 0)), duration_s=float(raw["duration"]),
        requests_per_s=float(raw["request_throughput"]), output_tokens_per_s=float(raw["output_throughput"]),
        total_output_tokens=int(raw["total_output_tokens"]), total_input_tokens=int(raw.get("total_input_tokens", 0)),
        latency_ms=latency, goodput_requests_per_s=gp.requests_per_s,
        goodput_output_tokens_per_s=gp.output_tokens_per_s, good_requests=gp.good_requests,
        vllm_request_goodput=raw.get("request_goodput"), errors=sorted({str(e) for e in errs if e})[:5],
    )


def run_bench(endpoint: str, model: str, options: BenchOptions | None = None, *,
              server_args: dict[str, Any] | None = None, worker: Worker | None = None) -> BenchResult:
    """Bench ``model`` at ``endpoint`` with the load ``options`` define, one vLLM client run per level.

    ``worker``: a ``Worker(BENCH_WORKER)`` started earlier (tune starts it with the server)."""
    from qlift.hardware import detect

    o = options or BenchOptions()
    dataset, slo, timeout_s = o.dataset, o.slo, o.timeout_s
    if dataset is not None and not dataset.is_file():
        raise NotFoundError(f"dataset {dataset} does not exist", hint="Pass a JSONL file of {\"prompt\": ...} rows.")
    base = api_base(endpoint)
    info = server_info(base, model)
    tok = o.tokenizer or pick_tokenizer(model, info["root"])
    with tempfile.TemporaryDirectory(prefix="qlift-bench-") as tmp:
        levels_path = Path(tmp) / "levels.jsonl"
        job = {"base_url": base, "model": model, "tokenizer": tok, "requests": o.requests, "input_len": o.input_tokens,
               "output_len": o.output_tokens, "dataset": str(dataset.resolve()) if dataset else None, "seed": o.seed,
               "temperature": 0.0, "concurrency": list(o.concurrency), "levels": str(levels_path),
               "goodput_args": vllm_goodput_args(slo)}
        complete, vllm_version = True, None
        try:
            if worker is None:
                vllm_version = run_worker(BENCH_WORKER, job, name="bench", timeout_s=timeout_s)["vllm_version"]
            else:
                worker.submit(job)
                vllm_version = worker.wait(timeout_s=timeout_s)["vllm_version"]
        except ExternalToolError as exc:
            if "did not finish within" not in exc.message:
                raise
            log.warning("bench: stopped at the %.0f s limit; keeping the levels that finished", timeout_s)
            complete = False
        raw_levels = [json.loads(t) for t in levels_path.read_text().splitlines()] if levels_path.exists() else []
    hw = detect()
    return BenchResult(
        kind=RESULT_KIND, endpoint=base, model=model, tokenizer=tok,
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        qlift_version=__version__, vllm_version=vllm_version,
        hardware={"description": hw.describe(), "gpus": [g.name for g in hw.gpus], "cpu_cores": hw.cpu.cores,
                  "machine": platform.machine()},
        server={**info, **({"args": server_args} if server_args else {})},
        workload={"requests": o.requests, "input_tokens": None if dataset else o.input_tokens,
                  "output_tokens": o.output_tokens, "dataset": str(dataset) if dataset else None, "seed": o.seed},
        slo_ms=slo, levels=[to_level(r, slo) for r in raw_levels], complete=complete,
    )


def check_outcome(result: BenchResult, timeout_s: float) -> None:
    """After the result is written: a run that measured nothing is a failure (exit 8), not a result.
    A level where every request failed, or a time limit reached before any level finished."""
    if not result.levels and not result.complete:
        raise ExternalToolError(f"no concurrency level finished within --timeout {timeout_s:g} s", tool="vllm",
                                hint="Raise --timeout, or lower --requests or --output-tokens.")
    for lv in result.levels:
        if lv.requests and lv.completed == 0:
            first = f" (first error: {lv.errors[0][:200]})" if lv.errors else ""
            raise ExternalToolError(f"all {lv.requests} requests failed at concurrency {lv.concurrency}{first}",
                                    tool="vllm", hint="Check the server's log and --model; the result records "
                                                      "each level's errors.")


def load_result(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFoundError(f"baseline {path} does not exist",
                            hint="Pass a result JSON from `qlift bench -o`.") from None
    except json.JSONDecodeError as exc:
        raise BadInputError(f"not JSON: {exc.msg}", path=path, line=exc.lineno, hint="Pass a `qlift bench -o` file.") \
            from None
    if not isinstance(data, dict) or data.get("kind") != RESULT_KIND:
        raise BadInputError(f"not a qlift bench result (kind is not {RESULT_KIND})", path=path, field="kind",
                            hint="Pass a file written by `qlift bench -o`.")
    return data


def compare(result: BenchResult, baseline: dict[str, Any], baseline_path: Path) -> dict[str, Any]:
    """Per concurrency level present in both: this run / baseline for throughput and latencies."""
    base_levels = {int(lv["concurrency"]): lv for lv in baseline.get("levels", [])}
    rows = []
    for lv in result.levels:
        b = base_levels.get(lv.concurrency)
        if b is None:
            continue

        def ratio(new: float, old: float) -> float | None:
            return round(new / old, 4) if old else None

        rows.append({
            "concurrency": lv.concurrency,
            "output_tokens_per_s": ratio(lv.output_tokens_per_s, b["output_tokens_per_s"]),
            "requests_per_s": ratio(lv.requests_per_s, b["requests_per_s"]),
            "goodput_requests_per_s": ratio(lv.goodput_requests_per_s, b["goodput_requests_per_s"]),
            **{f"p99_{m}_ms": ratio(lv.latency_ms[m]["p99"], b["latency_ms"][m]["p99"])
               for m in ("ttft", "tpot", "e2el")},
        })
    return {"path": str(baseline_path), "date": baseline.get("date"), "model": baseline.get("model"),
            "vllm_version": baseline.get("vllm_version"), "ratios": rows}
