"""`qlift release status`: what the journal says of the last run, each stage and the rollout."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path
from typing import Any

from qlift.release.journal import NAME, ReleaseJournal, RunOutcome, RunRow, StageRow, StageStatus, run_outcome
from qlift.release.liveplan import rollout_journal, rollout_state
from qlift.release.spec import Release
from qlift.release.stages import TABLE

_FIELDS = ("status", "key", "output", "content_hash", "started_at", "finished_at")
NEVER_RUN = "never run"
INTERRUPTED = "interrupted"  # journaled running by a run that was killed: nothing will finish it


def release_status(release: Release) -> dict[str, Any]:
    """The last run's outcome, each stage's latest row (with its duration), and the rollout's outcome."""
    path = release.out / NAME
    names = ["base", *(s.name for s in release.stages)]
    if not path.exists():
        return {"release": release.name, "journal": str(path), "last_run": None, "rollout": None,
                "stages": [{"name": n, "status": NEVER_RUN} for n in names]}
    stages: list[dict[str, Any]] = []
    rows: dict[str, StageRow] = {}
    last: dict[str, Any] | None = None
    killed = False
    with ReleaseJournal(path, readonly=True) as journal:
        last_run = journal.last_run()
        if last_run is not None:
            outcome, said = run_outcome(path, last_run)
            killed = outcome is RunOutcome.KILLED
            last = dataclasses.asdict(last_run) | {"outcome": said}
        for name in names:
            row = journal.latest(name)
            if row is None:
                stages.append({"name": name, "status": NEVER_RUN})
                continue
            rows[name] = row
            fields = {k: getattr(row, k) for k in _FIELDS}
            if killed and row.status is StageStatus.RUNNING:
                fields["status"] = INTERRUPTED
            stages.append({"name": name, **fields, "seconds": seconds(row)})
    promote = next((s.name for s in release.stages if TABLE[s.kind].moves_traffic), None)
    rollout = _rollout(release.out, rows.get(promote or ""), last_run, killed)
    return {"release": release.name, "journal": str(path), "last_run": last, "rollout": rollout,
            "stages": stages}


def seconds(row: StageRow) -> float | None:
    """How long the stage took (to the second, as journaled); None while it runs."""
    if not row.finished_at:
        return None
    took = datetime.fromisoformat(row.finished_at) - datetime.fromisoformat(row.started_at)
    return took.total_seconds()


def _rollout(out: Path, row: StageRow | None, last_run: RunRow | None, killed: bool) -> dict[str, Any] | None:
    if row is None:
        return None
    if row.status is StageStatus.RUNNING:  # the journal of this run's rollout; its process may be gone
        journal = rollout_journal(out, last_run.id) if last_run else None
        return {"state": INTERRUPTED if killed else "running", "reason": "",
                "journal": str(journal) if journal else None}
    state = rollout_state(row.result)
    if state is None:  # it failed before the rollout began (e.g. the router refused it)
        return {"state": "not started", "reason": row.result.get("error", ""), "journal": None}
    return {"state": state, "reason": row.result.get("reason", ""), "journal": row.result.get("journal")}


def status_lines(status: dict[str, Any]) -> list[str]:
    """The human view: the last run, one line per stage (status, key, duration, output), the rollout."""
    lines = []
    last_run = status["last_run"]
    if last_run:
        lines.append(f"last run {last_run['started_at']}: {last_run['outcome']} {last_run['detail']}".rstrip())
    for s in status["stages"]:
        key = s.get("key", "").removeprefix("sha256:")[:12]
        took = "" if s.get("seconds") is None else f"{s['seconds']:.0f} s"
        lines.append(f"{s['name']:<16} {s['status']:<11} {key:<12} {took:>7}  {s.get('output', '')}".rstrip())
    rollout = status["rollout"]
    if rollout:
        reason = f": {rollout['reason']}" if rollout["reason"] else ""
        lines.append(f"rollout {rollout['state']}{reason}")
        if rollout["journal"]:
            lines.append(f"rollout journal {rollout['journal']} (`qlift promote status --journal "
                         f"{rollout['journal']}`)")
    lines.append(f"release journal {status['journal']}")
    return lines
