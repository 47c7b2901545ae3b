"""`qlift release status`: what the journal says of the last run, each stage and the rollout."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path
from typing import Any

from qlift.release.journal import NAME, ReleaseJournal, RunOutcome, RunRow, StageRow, StageStatus, run_outcome
from qlift.release.kinds import TABLE
from qlift.release.livecontext import rollout_journal, rollout_state
from qlift.release.spec import Release

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
            from qlift.release.rollout_state import release_command

            said = said.replace("`qlift release run`", f"`{release_command(release)}`")  # the file (and --out) given
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
        if rollout is not None:
            rollout = _with_rollout_journal(release, journal, rows[promote or ""], last_run, rollout)
    return {"release": release.name, "journal": str(path), "last_run": last, "rollout": rollout,
            "stages": stages}


def seconds(row: StageRow) -> float | None:
    """How long the stage took (to the second, as journaled); None while it runs."""
    if not row.finished_at:
        return None
    took = datetime.fromisoformat(row.finished_at) - datetime.fromisoformat(row.started_at)
    return took.total_seconds()


def _with_rollout_journal(release: Release, journal: ReleaseJournal, row: StageRow, last_run: RunRow | None,
                          said: dict[str, Any]) -> dict[str, Any]:
    """The rollout as its own journal has it (state, step, weights, the controller's stops), the router's weights
    now, the release's servers and what to run next; ``said`` (the release journal's record) where it has none."""
    from qlift.release.rollout_state import next_steps, rollout_from_journal, servers

    path = row.result.get("journal") or (str(rollout_journal(release.out, last_run.id)) if last_run else None)
    rollout = rollout_from_journal(Path(path)) if path and Path(path).is_file() else None
    if rollout is None:
        return said
    live = servers(release, journal, last_run)
    return rollout | {"servers": live, "next": next_steps(release, rollout, live)}


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
        lines.append(f"rollout {rollout['state']}{_where(rollout)}{reason}")
        lines += _live_lines(rollout)
        if rollout["journal"]:
            lines.append(f"rollout journal {rollout['journal']} (`qlift promote status --journal "
                         f"{rollout['journal']}`)")
    lines.append(f"release journal {status['journal']}")
    return lines


def _weights(weights: dict[str, int] | None) -> str:
    return " / ".join(f"{k} {v}%" for k, v in (weights or {}).items()) or "-"


def _where(rollout: dict[str, Any]) -> str:
    """`` at step 1/2, weights stable 50% / canary 50%`` for a rollout read from its journal."""
    if "steps" not in rollout or rollout.get("final"):
        return ""
    return f" at step {rollout['step'] + 1}/{rollout['steps']}, weights {_weights(rollout['weights'])}"


def _live_lines(rollout: dict[str, Any]) -> list[str]:
    """The controller's stops and resumes, the router's weights now, each server, and what to run next."""
    out = [f"  controller {line}" for line in rollout.get("interruptions", [])]
    if rollout.get("interrupted") is None and not rollout.get("final", True) and not rollout.get("controller_running"):
        out.append("  controller: none running (it left no record of how it stopped: SIGKILL or a crash)")
    router = rollout.get("router")
    if router:
        now = f"holds {_weights(router['weights'])}" if router["weights"] is not None else \
            f"does not tell its weights: {router['error']}"
        out.append(f"  router {router['url']} {now}")
    for s in rollout.get("servers", []):
        who = f"started by the release, pid {s['pid']} {'running' if s['pid_alive'] else 'gone'}" \
            if s["started_by_release"] else "a running one the file names by url:"
        out.append(f"  {s['stage']} ({s['kind']}) {s['url'] or '-'}: "
                   f"{'answers' if s['answers'] else 'does not answer'} ({who})")
    out += [f"next: {step}" for step in rollout.get("next", [])]
    return out
