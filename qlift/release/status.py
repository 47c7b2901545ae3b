"""`qlift release status`: what the journal says of the last run, each stage and the rollout."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import NotRequired, TypedDict

from pydantic import JsonValue

from qlift.release.journal import NAME, ReleaseJournal, RunOutcome, RunRow, StageRow, StageStatus, run_outcome
from qlift.release.kinds import TABLE
from qlift.release.livecontext import rollout_journal, rollout_state
from qlift.release.rollout_state import RolloutView
from qlift.release.spec import Release

NEVER_RUN = "never run"
INTERRUPTED = "interrupted"  # journaled running by a run that was killed: nothing will finish it


class LastRun(TypedDict):
    """The last run's journaled row, its outcome as status says it."""

    id: int
    file: str
    started_at: str
    finished_at: str | None
    outcome: str
    detail: str


class StageLine(TypedDict):
    """A stage's latest row (only its name and status where it never ran)."""

    name: str
    status: str
    key: NotRequired[str]
    output: NotRequired[str]
    content_hash: NotRequired[str]
    started_at: NotRequired[str]
    finished_at: NotRequired[str | None]
    seconds: NotRequired[float | None]


class ReleaseStatus(TypedDict):
    """What `qlift release status` shows (``--json`` prints it)."""

    release: str
    journal: str
    last_run: LastRun | None
    rollout: RolloutView | None
    stages: list[StageLine]


def release_status(release: Release) -> ReleaseStatus:
    """The last run's outcome, each stage's latest row (with its duration), and the rollout's outcome."""
    path = release.out / NAME
    names = ["base", *(s.name for s in release.stages)]
    if not path.exists():
        return ReleaseStatus(release=release.name, journal=str(path), last_run=None, rollout=None,
                             stages=[StageLine(name=n, status=NEVER_RUN) for n in names])
    stages: list[StageLine] = []
    rows: dict[str, StageRow] = {}
    last: LastRun | None = None
    killed = False
    with ReleaseJournal(path, readonly=True) as journal:
        last_run = journal.last_run()
        if last_run is not None:
            outcome, said = run_outcome(path, last_run)
            killed = outcome is RunOutcome.KILLED
            from qlift.release.rollout_state import release_command

            said = said.replace("`qlift release run`", f"`{release_command(release)}`")  # the file (and --out) given
            last = LastRun(id=last_run.id, file=last_run.file, started_at=last_run.started_at,
                           finished_at=last_run.finished_at, outcome=said, detail=last_run.detail)
        for name in names:
            row = journal.latest(name)
            if row is None:
                stages.append(StageLine(name=name, status=NEVER_RUN))
                continue
            rows[name] = row
            status = INTERRUPTED if killed and row.status is StageStatus.RUNNING else row.status
            stages.append(StageLine(name=name, status=status, key=row.key, output=row.output,
                                    content_hash=row.content_hash, started_at=row.started_at,
                                    finished_at=row.finished_at, seconds=seconds(row)))
        promote = next((s.name for s in release.stages if TABLE[s.kind].moves_traffic), None)
        rollout = _rollout(release.out, rows.get(promote or ""), last_run, killed)
        if rollout is not None:
            rollout = _with_rollout_journal(release, journal, rows[promote or ""], last_run, rollout)
    return ReleaseStatus(release=release.name, journal=str(path), last_run=last, rollout=rollout, stages=stages)


def seconds(row: StageRow) -> float | None:
    """How long the stage took (to the second, as journaled); None while it runs."""
    if not row.finished_at:
        return None
    took = datetime.fromisoformat(row.finished_at) - datetime.fromisoformat(row.started_at)
    return took.total_seconds()


def _with_rollout_journal(release: Release, journal: ReleaseJournal, row: StageRow, last_run: RunRow | None,
                          said: RolloutView) -> RolloutView:
    """The rollout as its own journal has it (state, step, weights, the controller's stops), the router's weights
    now, the release's servers and what to run next; ``said`` (the release journal's record) where it has none."""
    from qlift.release.rollout_state import next_steps, rollout_from_journal, servers

    journaled = row.result.get("journal")
    path = journaled if isinstance(journaled, str) and journaled else \
        (str(rollout_journal(release.out, last_run.id)) if last_run else None)
    rollout = rollout_from_journal(Path(path)) if path and Path(path).is_file() else None
    if rollout is None:
        return said
    live = servers(release, journal, last_run)
    steps = next_steps(release, rollout, live)
    rollout["servers"], rollout["next"] = live, steps
    return rollout


def _rollout(out: Path, row: StageRow | None, last_run: RunRow | None, killed: bool) -> RolloutView | None:
    if row is None:
        return None
    if row.status is StageStatus.RUNNING:  # the journal of this run's rollout; its process may be gone
        journal = rollout_journal(out, last_run.id) if last_run else None
        return RolloutView(state=INTERRUPTED if killed else "running", reason="",
                           journal=str(journal) if journal else None)
    state = rollout_state(row.result)
    if state is None:  # it failed before the rollout began (e.g. the router refused it)
        return RolloutView(state="not started", reason=_text(row.result.get("error", "")), journal=None)
    journaled = row.result.get("journal")
    return RolloutView(state=state, reason=_text(row.result.get("reason", "")),
                       journal=journaled if isinstance(journaled, str) else None)


def _text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def status_lines(status: ReleaseStatus) -> list[str]:
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


def _weights(weights: Mapping[str, JsonValue] | None) -> str:
    return " / ".join(f"{k} {v}%" for k, v in (weights or {}).items()) or "-"


def _where(rollout: RolloutView) -> str:
    """`` at step 1/2, weights stable 50% / canary 50%`` for a rollout read from its journal."""
    if "steps" not in rollout or rollout.get("final"):
        return ""
    return f" at step {rollout['step'] + 1}/{rollout['steps']}, weights {_weights(rollout['weights'])}"


def _live_lines(rollout: RolloutView) -> list[str]:
    """The controller's stops and resumes, the router's weights now, each server, and what to run next."""
    out = [f"  controller {line}" for line in rollout.get("interruptions", [])]
    if rollout.get("interrupted") is None and not rollout.get("final", True) and not rollout.get("controller_running"):
        out.append("  controller: none running (it left no record of how it stopped: SIGKILL or a crash)")
    router = rollout.get("router")
    if router:
        weights = router["weights"]
        now = f"holds {_weights(weights)}" if isinstance(weights, dict) else \
            f"does not tell its weights: {router['error']}"
        out.append(f"  router {router['url']} {now}")
    for s in rollout.get("servers", []):
        who = f"started by the release, pid {s['pid']} {'running' if s['pid_alive'] else 'gone'}" \
            if s["started_by_release"] else "a running one the file names by url:"
        out.append(f"  {s['stage']} ({s['kind']}) {s['url'] or '-'}: "
                   f"{'answers' if s['answers'] else 'does not answer'} ({who})")
    out += [f"next: {step}" for step in rollout.get("next", [])]
    return out
