"""``qlift batch --ray ADDRESS``: the same rows through Ray Data on an existing Ray cluster.

The worker process is the Ray driver. Rows travel as JSON strings (one column, so nested
messages and per-row sampling survive Ray's columnar batches); ``map_batches`` runs them
through vLLM engine actors, one per GPU (one per CPU slot on a cluster without GPUs), each
using the same engine loop as the local path. The driver appends each finished batch to OUT
as it arrives, so the resume rule is the same; the parent puts OUT in input order at the end.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from qlift.perf.batch_rows import BatchRow


class EngineActor:
    """One vLLM engine in a Ray actor; called with batches of JSON rows."""

    def __init__(self, job: dict[str, Any]) -> None:
        from qlift.perf.batch_worker import make_llm

        self.job = job
        self.llm = make_llm(job)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        from qlift.perf.batch_worker import generate

        outs: list[str] = []
        errors: list[str] = []
        meta: list[str] = []
        rows = [BatchRow(**json.loads(str(text))) for text in batch["row"]]

        def on_row(out_row: dict[str, Any], row: BatchRow, n_prompt: int, n_out: int) -> None:
            outs.append(json.dumps(out_row, ensure_ascii=False))
            errors.append("")
            meta.append(json.dumps([n_prompt, n_out]))

        def on_error(row: BatchRow, reason: str) -> None:
            outs.append("")
            errors.append(json.dumps({"line": row.line, "id": row.id, "error": reason}))
            meta.append("[0, 0]")

        generate(self.llm, rows, self.job, on_row, on_error)
        return {"out": outs, "error": errors, "meta": meta}


def run_ray(job: dict[str, Any], rows: list[BatchRow]) -> dict[str, Any]:
    import ray

    from qlift.perf.batch_worker import DurableWriter

    qlift_dir = str(Path(__file__).resolve().parents[1])
    address = None if job["ray"] == "local" else job["ray"]
    env_vars = {k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "HF_HUB_OFFLINE")
                if k in os.environ}
    local: dict[str, Any] = {"include_dashboard": False} if address is None else {}  # only a new cluster takes it
    ray.init(address=address, runtime_env={"py_modules": [qlift_dir], "env_vars": env_vars}, log_to_driver=False,
             **local)
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        engines = int(job.get("ray_engines") or max(1, gpus))
        import ray.data

        items = ray.data.from_items([{"row": json.dumps(asdict(r))} for r in rows])
        ds = items.map_batches(EngineActor, fn_constructor_kwargs={"job": job}, batch_size=int(job["window"]),
                            concurrency=engines, num_gpus=1 if gpus else 0, num_cpus=0 if gpus else 1)
        t0 = time.monotonic()
        totals = {"rows": 0, "prompt_tokens": 0, "completion_tokens": 0}
        errors: list[dict[str, Any]] = []
        writer = DurableWriter(Path(job["out"]))
        try:
            for item in ds.iter_rows():
                if item["error"]:
                    errors.append(json.loads(item["error"]))
                    continue
                writer.fh.write(item["out"] + "\n")
                writer.write_done()
                n_prompt, n_out = json.loads(item["meta"])
                totals["rows"] += 1
                totals["prompt_tokens"] += n_prompt
                totals["completion_tokens"] += n_out
        finally:
            writer.close()
        return {**totals, "errors": errors, "load_s": 0.0, "generate_s": time.monotonic() - t0, "engines": engines}
    finally:
        ray.shutdown()
