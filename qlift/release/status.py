"""`qlift release status`: what the journal says of the last run, each stage and the rollout."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from pydantic import JsonValue

from qlift.release.journal import NAME, ReleaseJournal, RunOutcome, RunRow, StageRow, StageStatus, run_outcome
from qlift.release.kinds import TABLE
from qlift.release.livecontext import rollout_journal, rollout_state
from qlift.release.rollout_state import PromoteShown, ReadRollout, SaidRollout
from qlift.release.spec import Release
from qlift.rollout.journal import journal_flag, with_journal


class StageShown(StrEnum):
    """A stage's status, as status shows it, where its journaled row does not tell it."""

    NEVER_RUN = "never run"
    INTERRUPTED = "interrupted"  # journaled running by a run that was killed: nothing will finish it


@dataclass(frozen=True)
class LastRun:
    """The last run's journaled row, its outcome as status says it."""

    id: int
    file: str
    started_at: str
    finished_at: str | None
    outcome: str
    detail: str


@dataclass(frozen=True)
class UnrunStage:
    """A stage the journal holds no row of."""

    name: str
    status: StageShown = StageShown.NEVER_RUN


@dataclass(frozen=True)
class StageLine:
    """A stage's latest row, with how long it took (None while it runs)."""

    name: str
    status: StageStatus | StageShown
    key: str
    output: str
    content_hash: str
    started_at: str
    finished_at: str | None
    seconds: float | None


@dataclass(frozen=True)
class ReleaseStatus:
    """What `qlift release status` shows (``--json`` prints it)."""

    release: str
    journal: str
    last_run: LastRun | None
    rollout: SaidRollout | ReadRollout | None
    stages: list[StageLine | UnrunStage]


def release_status(release: Release, echo: Callable[[str], None] | None = None) -> ReleaseStatus:
    """The last run's outcome, each stage's latest row (with its duration), and the rollout's outcome. A rollout
    ended outside the release is journaled first (``follow``), the line saying so handed to ``echo``."""
    from qlift.release.follow import follow_beside

    path = release.out / NAME
    follow_beside(release, echo or (lambda line: None))
    names = ["base", *(s.name for s in release.stages)]
    if not path.exists():
        return ReleaseStatus(release=release.name, journal=str(path), last_run=None, rollout=None,
                             stages=[UnrunStage(n) for n in names])
    stages: list[StageLine | UnrunStage] = []
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
                stages.append(UnrunStage(name))
                continue
            rows[name] = row
            status = StageShown.INTERRUPTED if killed and row.status is StageStatus.RUNNING else row.status
            stages.append(StageLine(name=name, status=status, key=row.key, output=row.output,
                                    content_hash=row.content_hash, started_at=row.started_at,
                                    finished_at=row.finished_at, seconds=seconds(row)))
        promote = next((s.name for s in release.stages if TABLE[s.kind].moves_traffic), None)
        recorded = _rollout(release.out, rows.get(promote or ""), last_run, killed)
        rollout = None if recorded is None else \
            _with_rollout_journal(release, journal, rows[promote or ""], last_run, recorded)
    return ReleaseStatus(release=release.name, journal=str(path), last_run=last, rollout=rollout, stages=stages)


def seconds(row: StageRow) -> float | None:
    """How long the stage took (to the second, as journaled); None while it runs."""
    if not row.finished_at:
        return None
    took = datetime.fromisoformat(row.finished_at) - datetime.fromisoformat(row.started_at)
    return took.total_seconds()


def _with_rollout_journal(release: Release, journal: ReleaseJournal, row: StageRow, last_run: RunRow | None,
                          said: SaidRollout) -> SaidRollout | ReadRollout:
    """The rollout as its own journal has it (state, step, weights, the controller's stops), the router's weights
    now, the release's servers and what to run next; ``said`` (the release journal's record) where it has none."""
    from qlift.release.rollout_state import next_steps, rollout_from_journal, servers

    journaled = row.result.get("journal")
    path = journaled if isinstance(journaled, str) and journaled else \
        (str(rollout_journal(release.out, last_run.id)) if last_run else None)
    st = rollout_from_journal(Path(path)) if path and Path(path).is_file() else None
    if st is None:
        return said
    live = servers(release, journal, last_run)
    return ReadRollout(st, live, next_steps(release, st, live))


def _rollout(out: Path, row: StageRow | None, last_run: RunRow | None, killed: bool) -> SaidRollout | None:
    if row is None:
        return None
    if row.status is StageStatus.RUNNING:  # the journal of this run's rollout; its process may be gone
        journal = rollout_journal(out, last_run.id) if last_run else None
        return SaidRollout(PromoteShown.INTERRUPTED if killed else PromoteShown.RUNNING, "",
                           str(journal) if journal else None)
    state = rollout_state(row.result)
    if state is None:  # it failed before the rollout began (e.g. the router refused it)
        return SaidRollout(PromoteShown.NOT_STARTED, _text(row.result.get("error", "")), None)
    journaled = row.result.get("journal")
    return SaidRollout(state, _text(row.result.get("reason", "")), journaled if isinstance(journaled, str) else None)


def _text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def status_lines(status: ReleaseStatus) -> list[str]:
    """The human view: the last run, one line per stage (status, key, duration, output), the rollout."""
    lines = []
    last_run = status.last_run
    if last_run:
        lines.append(f"last run {last_run.started_at}: {last_run.outcome} {last_run.detail}".rstrip())
    lines += [_stage_line(s) for s in status.stages]
    rollout = status.rollout
    if isinstance(rollout, ReadRollout):
        lines += _read_rollout_lines(rollout)
    elif rollout is not None:
        lines.append(f"rollout {rollout.state}{_reason(with_journal(rollout.reason, rollout.journal))}")
    if rollout is not None and rollout.journal:
        lines.append(f"rollout journal {rollout.journal} (`qlift promote status{journal_flag(rollout.journal)}`)")
    lines.append(f"release journal {status.journal}")
    return lines


def _stage_line(s: StageLine | UnrunStage) -> str:
    if isinstance(s, UnrunStage):
        return f"{s.name:<16} {s.status}"
    key = s.key.removeprefix("sha256:")[:12]
    took = "" if s.seconds is None else f"{s.seconds:.0f} s"
    return f"{s.name:<16} {s.status:<11} {key:<12} {took:>7}  {s.output}".rstrip()


def _reason(reason: str) -> str:
    return f": {reason}" if reason else ""


def _weights(weights: Mapping[str, JsonValue] | None) -> str:
    return " / ".join(f"{k} {v}%" for k, v in (weights or {}).items()) or "-"


def _read_rollout_lines(rollout: ReadRollout) -> list[str]:
    """The rollout's state (and, unless it is final, its step and weights), the controller's stops and resumes,
    the router's weights now, each server, and what to run next."""
    st = rollout.status
    where = "" if st.final else f" at step {st.step + 1}/{len(st.steps)}, weights {_weights(st.weights)}"
    out = [f"rollout {st.state}{where}{_reason(with_journal(st.reason, st.journal))}"]
    out += [f"  controller {i.line()}" for i in st.interruptions]
    if st.interrupted is None and not st.final and not st.controller.alive:
        out.append("  controller: none running (it left no record of how it stopped: SIGKILL or a crash)")
    if st.live:
        weights = st.live["weights"]
        now = f"holds {_weights(weights)}" if isinstance(weights, dict) else \
            f"does not tell its weights: {st.live['error']}"
        out.append(f"  router {st.live['url']} {now}")
    for s in rollout.servers:
        who = f"started by the release, pid {s.pid} {'running' if s.pid_alive else 'gone'}" \
            if s.started_by_release else "a running one the file names by url:"
        out.append(f"  {s.stage} ({s.kind}) {s.url or '-'}: {'answers' if s.answers else 'does not answer'} ({who})")
    out += [f"next: {step}" for step in rollout.next]
    return out
