"""``--eval-report``: refuse to start unless `qlift eval` passed on the model the canary serves.

The match is by lineage content hash: the report's ``candidate.content_hash`` (the same
digest `qlift eval` and every qlift manifest compute: path, size and sha256 of each file)
must equal the hash of the canary's model dir. The report's own manifest is checked too,
so an edited report.json is refused.

The canary's hash is the spec's ``canary_hash`` when given (its ``ModelRef`` content hash, as
`qlift serve` records it and `qlift release` passes it); otherwise that of its model dir:
``--canary-model DIR`` when given, else the ``root`` that the canary's vLLM server reports in
``/v1/models`` (the ``--model`` it was started with), when that is a directory on this machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, GateFailedError, IntegrityError, NotFoundError
from qlift.fsutil import sha256_file
from qlift.lineage import read_manifest
from qlift.models.ref import dir_hash
from qlift.vllm.client import VllmClient, VllmError


def served_model_dir(backend_url: str, model: str | None = None) -> Path | None:
    """The model dir a vLLM server was started with (``root`` in /v1/models), if local; with ``model``,
    that entry's root (for a LoRA adapter, the adapter dir vLLM loaded)."""
    try:
        entries = VllmClient(backend_url, timeout_s=5.0).models()
    except VllmError:
        return None
    entry = next((m for m in entries if m.id == model), entries[0] if entries else None)
    root = entry.root if entry is not None else None
    return Path(root) if root and Path(root).is_dir() else None


def read_report(report_dir: Path) -> dict[str, Any]:
    report_dir = Path(report_dir)
    path = report_dir / "report.json"
    if not path.is_file():
        raise NotFoundError(f"no eval report at {path}",
                            hint="Run `qlift eval CANARY --baseline STABLE ... --report DIR` first.")
    manifest = read_manifest(report_dir) or {}
    recorded = (manifest.get("outputs") or {}).get("report.json", {}).get("sha256")
    if recorded and recorded != sha256_file(path):
        raise IntegrityError(f"{path} does not match the sha256 its qlift.json records (edited after eval?)")
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise BadInputError(f"not valid JSON: {exc}", path=path) from None
    return data


def check_eval_report(report_dir: Path, canary_model: Path | None = None, base_model: Path | None = None, *,
                      canary_hash: str | None = None) -> dict[str, Any]:
    """Raise unless ``report_dir`` is a passing eval of exactly the canary: the model whose
    ``ModelRef`` content hash is ``canary_hash``, else the dir ``canary_model``; return a summary.
    A LoRA adapter dir (served unmerged on ``base_model``) matches by lineage too, see
    ``qlift.rollout.adapter.adapter_matches_report``."""
    report = read_report(report_dir)
    candidate = report.get("candidate") or {}
    want = candidate.get("content_hash")
    if not want:
        raise BadInputError("the report has no candidate content hash (evaluated through an endpoint?)",
                            path=Path(report_dir) / "report.json", field="candidate.content_hash",
                            hint="Evaluate the model directory itself so the report can be matched.")
    if canary_hash is not None:
        got, what = canary_hash, "the canary's model"
        matched = got == want
        hint = "Evaluate the model the canary serves, or give the canary_hash of the evaluated model."
    else:
        if canary_model is None:
            raise BadInputError("the eval gate needs the canary's model dir or its content hash",
                                field="--canary-model", hint="Pass --canary-model DIR.")
        got, what = dir_hash(Path(canary_model)), f"the canary's model {canary_model}"
        matched = got == want
        if not matched and (Path(canary_model) / "adapter_config.json").is_file():
            from qlift.rollout.adapter import adapter_matches_report

            matched = adapter_matches_report(report, Path(canary_model), base_model) is not None
        hint = "Evaluate the model the canary serves, or point --canary-model at the evaluated dir."
    if not matched:
        raise GateFailedError(
            f"{what} ({got[:19]}...) is not the model the eval report {report_dir} evaluated ({want[:19]}...)",
            hint=hint)
    if not report.get("passed"):
        failed = [g.get("expr") for g in report.get("gates", []) if not g.get("passed")]
        raise GateFailedError(f"the eval report {report_dir} did not pass (failed gates: {', '.join(failed)})",
                              hint="The canary is not ready to promote.")
    return {"report": str(report_dir), "content_hash": got, "gates": [g.get("expr") for g in report.get("gates", [])]}
