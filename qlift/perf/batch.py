"""``qlift batch``: offline inference over a JSONL file with one vLLM engine (or a Ray cluster).

The parent reads and checks the input (bad rows go to ``OUT.errors.jsonl`` with line numbers),
under ``--resume`` keeps the rows of OUT whose id and request are unchanged
(``qlift.perf.batch_state``), runs ``qlift.perf.batch_worker`` in vLLM's interpreter, shows
progress from the rows the worker appends to OUT, and at the end rewrites OUT in input order
with each id once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qlift import progress
from qlift.errors import OutputExistsError
from qlift.fsutil import AppendedLines
from qlift.perf.batch_rows import finalize, read_input, write_errors
from qlift.perf.batch_state import BatchFiles, Resumed, hashes_for, keep_only, remove_stale, write_state
from qlift.perf.batch_state import resume as resume_output
from qlift.perf.options import BatchOptions
from qlift.vllm.worker import Worker

log = logging.getLogger(__name__)


@dataclass
class BatchResult:
    output: Path
    errors_file: Path | None
    rows_total: int  # valid input rows
    rows_done_before: int  # kept by --resume (same id, same request)
    rows_changed: int  # --resume: in OUT, but the request changed since, so run again
    rows_dropped: int  # --resume: in OUT, but no longer in the input, so removed
    rows_written: int  # this run
    rows_failed: int  # malformed or refused, in the errors file
    output_rows: int  # rows in the final OUT
    prompt_tokens: int
    completion_tokens: int
    load_s: float
    generate_s: float
    rows_per_s: float
    output_tokens_per_s: float
    recipe: str
    vllm_version: str | None
    engines: int = 1
    ray_address: str | None = None  # with Ray, generate_s includes the engines' start
    notes: list[str] = field(default_factory=list)


class _Progress:
    """Reads the rows the worker appends to OUT: a bar with rows/s and output tok/s."""

    def __init__(self, out: Path, total: int) -> None:
        self.appended = AppendedLines(out)
        self.appended.skip_existing()  # rows a resumed run kept are not this run's progress
        self.rows = self.tokens = 0
        self.started: float | None = None
        self.bar = progress.counter(total, desc="batch", unit="row")

    def __call__(self) -> None:
        lines = self.appended.read()
        if not lines:
            return
        for text in lines:
            try:
                usage = json.loads(text)
                usage = usage.get("usage") or usage["response"]["body"]["usage"]
                self.tokens += int(usage["completion_tokens"])
            except (ValueError, KeyError, TypeError):
                pass
        if self.started is None:
            self.started = time.monotonic()
        self.rows += len(lines)
        elapsed = max(time.monotonic() - self.started, 1e-6)
        self.bar.set_postfix_str(f"{self.rows / elapsed:.1f} rows/s, {self.tokens / elapsed:.0f} tok/s", refresh=False)
        self.bar.update(len(lines))

    def close(self) -> None:
        self.bar.close()


def run_batch(model: Path, input_path: Path, out: Path, options: BatchOptions | None = None, *,
              window: int | None = None) -> BatchResult:
    """Run every row of ``input_path`` through ``model``; see the module docstring. ``window``: rows in
    flight at once (default: four times the engine's max_num_seqs, at least 256)."""
    opts = options or BatchOptions()
    files = BatchFiles.beside(out)
    files.check([input_path, model])
    if out.exists() and not (opts.resume or opts.force):
        raise OutputExistsError(out)
    ray_address = opts.ray_address
    if ray_address is None:  # a Ray cluster's workers may have GPUs
        from qlift.cpu_support import require_cpu_support

        require_cpu_support(model, what="run a batch with")
    parsed = read_input(input_path)
    sampling: dict[str, Any] = {"max_tokens": opts.max_tokens}
    if opts.temperature is not None:
        sampling["temperature"] = opts.temperature
    hashes = hashes_for(parsed.rows, sampling)
    # An earlier OUT is read (or refused) before anything starts, and rewritten only below.
    done = resume_output(files, parsed.rows, hashes) if opts.resume else Resumed({}, 0, 0)
    todo = [r for r in parsed.rows if r.id not in done.kept]
    result: dict[str, Any] = {"rows": 0, "prompt_tokens": 0, "completion_tokens": 0, "errors": [],
                              "load_s": 0.0, "generate_s": 0.0, "vllm_version": None, "engines": 0}
    errors_path = files.errors
    errors = [e.as_json() for e in parsed.errors]
    with contextlib.ExitStack() as stack:
        # Started first: its vLLM import overlaps the recipe and memory plan (which may import torch).
        worker = stack.enter_context(Worker("qlift.perf.batch_worker", name="batch")) if todo else None
        from qlift.perf.engine import engine_for  # 0.5 s of imports: after the worker's start, not before it

        engine = engine_for(model, recipe=opts.recipe, workload="batch", sets=list(opts.sets),
                            in_process=ray_address is None)
        if opts.force:
            remove_stale(files)
        if opts.resume:
            keep_only(files, done)
        write_state(files, hashes)
        write_errors(errors_path, errors)
        for e in parsed.errors[:5]:
            log.warning("%s:%d: %s", input_path, e.line, e.reason)
        if len(parsed.errors) > 5:
            log.warning("%d more malformed rows; all are in %s", len(parsed.errors) - 5, errors_path)
        out.touch()
        log.info("batch: %d rows to run (%d already in %s, %d malformed), recipe %s", len(todo), len(done.kept),
                 out, len(parsed.errors), engine.recipe.name)
        if done.changed or done.dropped:
            log.info("batch: --resume runs %d changed rows again and dropped %d rows no longer in the input",
                     done.changed, done.dropped)
        if worker is not None:
            seqs = int(engine.engine_args.get("max_num_seqs") or 256)
            worker.submit({
                "model": str(model.resolve()), "engine_args": engine.engine_args, "env": engine.env,
                "rows": [asdict(r) for r in todo],
                "sampling": sampling,
                "out": str(out.resolve()), "served_name": model.resolve().name,
                "window": window or max(4 * seqs, 256), "ray": ray_address, "threads": engine.threads,
            })
            watch = _Progress(out, len(todo))
            try:
                result = worker.wait(timeout_s=opts.timeout_s, on_poll=watch)
            finally:
                watch.close()
    if result["errors"]:
        write_errors(errors_path, errors + result["errors"])
    final_rows = finalize(out, parsed.order)
    gen_s = float(result["generate_s"]) or 1e-9
    return BatchResult(
        output=out, errors_file=errors_path if errors_path.exists() else None, rows_total=len(parsed.rows),
        rows_done_before=len(done.kept), rows_changed=done.changed, rows_dropped=done.dropped,
        rows_written=int(result["rows"]),
        rows_failed=len(parsed.errors) + len(result["errors"]), output_rows=final_rows,
        prompt_tokens=int(result["prompt_tokens"]), completion_tokens=int(result["completion_tokens"]),
        load_s=float(result["load_s"]), generate_s=float(result["generate_s"]),
        rows_per_s=result["rows"] / gen_s if todo else 0.0,
        output_tokens_per_s=result["completion_tokens"] / gen_s if todo else 0.0,
        recipe=engine.recipe.name, vllm_version=result["vllm_version"], engines=int(result.get("engines", 1)),
        ray_address=ray_address, notes=engine.notes,
    )
