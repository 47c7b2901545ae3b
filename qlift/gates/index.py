"""The gate index: one small record per gated eval report, filed under the candidate's content hash.

`qlift eval --report DIR --gate ...` (with a baseline) writes
``$QLIFT_HOME/gates/<sha256 hex>/<UTC time>-<pid>.json``: the report's path and date, the vLLM engine
arguments the candidate ran with (``--set``, e.g. ``kv_cache_dtype=fp8``), every gate with its value
and threshold, and whether all passed. `qlift serve --recipe auto` reads the newest record whose
engine arguments match a setting it may turn on (qlift.serve.kv_gate), so a serving setting that
changes the model's answers is used only where an eval of that exact checkpoint allowed it.
A failing record written later wins over an earlier passing one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qlift.fsutil import write_json_atomic
from qlift.lineage import utc_now
from qlift.settings import qlift_home


def index_dir() -> Path:
    return qlift_home() / "gates"


def _hash_dir(content_hash: str) -> Path:
    return index_dir() / content_hash.removeprefix("sha256:")


def record_of(result: Any, report_dir: Path) -> dict[str, Any] | None:
    """The index record of an eval result (an ``EvalResult``), or None when it says nothing about the
    candidate against a baseline (no gates, no baseline, or a candidate without a content hash)."""
    cand, base = result.candidate, result.baseline
    if not result.gates or base is None or cand.content_hash is None:
        return None
    return {
        "content_hash": cand.content_hash,
        "candidate": str(cand.path or cand.name),
        "engine_args": dict(cand.engine_args),
        "baseline": str(base.path or base.name),
        "baseline_hash": base.content_hash,
        "baseline_engine_args": dict(base.engine_args),
        "passed": bool(result.passed),
        "date": utc_now(),
        "report": str(Path(report_dir).resolve() / "report.json"),
        "prompts": result.prompts,
        "examples": result.examples_count,
        "backend": result.backend,
        "gates": [{"expr": g.expr, "passed": g.passed, "value": g.value, "threshold": g.threshold,
                   "baseline": g.baseline} for g in result.gates],
    }


def write_record(record: dict[str, Any]) -> Path:
    stamp = record["date"].replace(":", "").replace("-", "").replace("+0000", "Z")
    path = _hash_dir(record["content_hash"]) / f"{stamp}-{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)
    return path


def _read(path: Path) -> dict[str, Any] | None:
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def records(content_hash: str) -> list[dict[str, Any]]:
    """Every readable record for ``content_hash``, oldest first (unreadable files are skipped)."""
    folder = _hash_dir(content_hash)
    out = []
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        rec = _read(p)
        if rec is not None and rec.get("content_hash") == content_hash:
            rec["index_file"] = str(p)
            out.append(rec)
    return sorted(out, key=lambda r: (str(r.get("date", "")), r["index_file"]))


def _matches(record: dict[str, Any], engine_arg: str, values: tuple[str, ...],
             keep: Callable[[dict[str, Any]], bool]) -> bool:
    return str((record.get("engine_args") or {}).get(engine_arg)) in values and keep(record)


def newest(content_hash: str, *, engine_arg: str, values: tuple[str, ...],
           keep: Callable[[dict[str, Any]], bool] = lambda r: True) -> dict[str, Any] | None:
    """The newest record for ``content_hash`` whose candidate ran with ``engine_arg`` in ``values`` and that
    ``keep`` accepts."""
    found = [r for r in records(content_hash) if _matches(r, engine_arg, values, keep)]
    return found[-1] if found else None


def any_checkpoint_has(*, engine_arg: str, values: tuple[str, ...],
                       keep: Callable[[dict[str, Any]], bool] = lambda r: True) -> bool:
    """Whether a record of any checkpoint matches (as ``newest`` would): where none does, a caller
    need not hash a model (a full read of its weights the first time) to learn that its answer is none."""
    root = index_dir()
    for p in root.glob("*/*.json") if root.is_dir() else []:
        rec = _read(p)
        if rec is not None and _matches(rec, engine_arg, values, keep):
            return True
    return False
