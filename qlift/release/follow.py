"""The release journal follows its rollout: a rollout the release started and an operator ended outside it
(`qlift promote resume`, `finish`, `abort` or `promote` of its journal, as `release status` suggests) is journaled
here as the rollout's own journal has it, by the next release command, once: the promote stage done (promoted,
finished) or failed (rolled back, aborted), with a line saying where the outcome came from, and the run that left
it so done or failed with that line. A re-run then plans from the truth: nothing for a promoted release, a new
rollout for one rolled back.

``release run`` follows under its writer lock; ``release status`` and ``--dry-run`` take that lock only to write,
only when there is something to follow, and never while a run holds it (that run follows its own rollout).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import JsonValue

from qlift.fsutil import file_lock, lock_holder
from qlift.release.journal import NAME, ReleaseJournal, RunOutcome, RunRow, StageRow, StageStatus, writer_lock_path
from qlift.release.kinds import TABLE
from qlift.release.livecontext import rollout_journal, rollout_state
from qlift.release.rollout_state import rollout_from_journal
from qlift.release.spec import Release

if TYPE_CHECKING:
    from qlift.rollout.status import RolloutStatus


@dataclass(frozen=True)
class Unsettled:
    """A promote row whose rollout its own journal has final in another state than the row says."""

    row: StageRow
    status: RolloutStatus
    journal: Path
    run: RunRow | None  # the run that ran it, where it is the last one


def promote_journal(release: Release, row: StageRow, last_run: RunRow | None) -> Path | None:
    """The rollout journal of a promote row: the one it names, else its run's (a run killed or stopped before
    promote journaled its result; the row began in the last run)."""
    named = row.result.get("journal")
    if isinstance(named, str) and named:
        return Path(named)
    if last_run is not None and row.started_at >= last_run.started_at:
        return rollout_journal(release.out, last_run.id)
    return None


def unsettled(release: Release, journal: ReleaseJournal) -> Unsettled | None:
    """The release's promote row, where its rollout ended (in its own journal) otherwise than the row says."""
    promote = next((s for s in release.stages if TABLE[s.kind].moves_traffic), None)
    row = journal.latest(promote.name) if promote is not None else None
    if row is None:
        return None
    last_run = journal.last_run()
    path = promote_journal(release, row, last_run)
    st = rollout_from_journal(path) if path is not None and path.is_file() else None
    if path is None or st is None or not st.final:
        return None
    if row.status is not StageStatus.RUNNING and rollout_state(row.result) is st.state:
        return None  # journaled already
    ran_it = last_run is not None and row.started_at >= last_run.started_at
    return Unsettled(row, st, path, last_run if ran_it else None)


def settle(journal: ReleaseJournal, u: Unsettled) -> str:
    """Journal the rollout's outcome on its promote row (and on the run that ran it); the line saying so."""
    from qlift.rollout.states import State

    st, row = u.status, u.row
    said = rollout_state(row.result)
    was = str(said) if said is not None else \
        f"{row.status}" + (f" ({row.result['error']})" if isinstance(row.result.get("error"), str) else "")
    line = (f"{row.name}: rollout {st.state} outside this release ({st.reason or 'no reason given'}), as its own "
            f"journal {u.journal} says; the release journal said {was} and now says {st.state}")
    done = st.state in (State.PROMOTED, State.FINISHED)
    result: dict[str, JsonValue] = {**row.result, "state": st.state.value, "reason": st.reason,
                                    "journal": str(u.journal), "followed": line}
    journal.settle(row.name, row.key, StageStatus.DONE if done else StageStatus.FAILED, result)
    if u.run is not None:
        journal.settle_run(u.run.id, RunOutcome.DONE if done else RunOutcome.FAILED, line)
    return line


def follow(release: Release, journal: ReleaseJournal, echo: Callable[[str], None]) -> str | None:
    """Follow the rollout into ``journal`` (the caller holds its writer lock); the line said, if any."""
    u = unsettled(release, journal)
    if u is None:
        return None
    line = settle(journal, u)
    echo(line)
    return line


def follow_beside(release: Release, echo: Callable[[str], None]) -> str | None:
    """For `release status` and `--dry-run`: follow the rollout where there is something to follow and no run
    holds the journal (a journal this user cannot write is left as it is: status still reads the rollout's)."""
    path = release.out / NAME
    lock = writer_lock_path(path)
    if not path.is_file() or lock_holder(lock) is not None:
        return None
    with ReleaseJournal(path, readonly=True) as journal:
        if unsettled(release, journal) is None:
            return None
    with contextlib.suppress(OSError, sqlite3.Error), file_lock(lock, wait=False) as mine:
        if mine:
            with ReleaseJournal(path) as journal:
                return follow(release, journal, echo)
    return None
