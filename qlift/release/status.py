"""`qlift release status`: what the journal says of the last run, each stage and the rollout."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from qlift.release.journal import NAME, ReleaseJournal, run_outcome
from qlift.release.liveplan import rollout_journal
from qlift.release.spec import Release

_FIELDS = ("status", "key", "output", "content_hash", "started_at", "finished_at")


def release_status(release: Release) -> dict[str, Any]:
    """The last run's outcome, each stage's latest row (with its duration), and the rollout's outcome."""
    path = release.out / NAME
    names = ["base", *(s.name for s in release.stages)]
    if not path.exists():
        return {"release": release.name, "journal": str(path), "last_run": None, "rollout": None,
                "stages": [{"name": n, "status": "never run"} for n in names]}
    stages: list[dict[str, Any]] = []
    rows: dict[str, dict[str, Any]] = {}
    with ReleaseJournal(path, readonly=True) as journal:
        last_run = journal.last_run()
        if last_run is not None:
            last_run["outcome"] = run_outcome(path, last_run)
        for name in names:
            row = journal.latest(name)
            if row is None:
                stages.append({"name": name, "status": "never run"})
                continue
            rows[name] = row
            stages.append({"name": name, **{k: row[k] for k in _FIELDS}, "seconds": seconds(row)})
    killed = last_run is not None and str(last_run["outcome"]).startswith("killed")
    for s in stages:
        if killed and s["status"] == "running":  # its process is gone: what it was doing will not finish by itself
            s["status"] = "interrupted"
    promote = next((s.name for s in release.stages if s.kind == "promote"), None)
    rollout = _rollout(release.out, rows.get(promote or ""), last_run)
    return {"release": release.name, "journal": str(path), "last_run": last_run, "rollout": rollout,
            "stages": stages}


def seconds(row: dict[str, Any]) -> float | None:
    """How long the stage took (to the second, as journaled); None while it runs."""
    if not row.get("finished_at"):
        return None
    took = datetime.fromisoformat(row["finished_at"]) - datetime.fromisoformat(row["started_at"])
    return took.total_seconds()


def _rollout(out: Path, row: dict[str, Any] | None, last_run: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    result = row["result"]
    if row["status"] == "running":  # the journal of this run's rollout; its process may be gone
        journal = rollout_journal(out, int(last_run["id"])) if last_run else None
        killed = last_run is not None and str(last_run["outcome"]).startswith("killed")
        return {"state": "interrupted" if killed else "running", "reason": "", "journal": str(journal) if journal
                else None}
    if "state" not in result:  # it failed before the rollout began (e.g. the router refused it)
        return {"state": "not started", "reason": result.get("error", ""), "journal": None}
    return {"state": result["state"], "reason": result.get("reason", ""), "journal": result.get("journal")}


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
