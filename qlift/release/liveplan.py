"""The live stages' keys and run: serve, router and promote, keyed and journaled together.

Each live stage goes through its door (``qlift.release.livestages.LIVE_DOORS``): the servers are keyed first (the
others' keys are made of theirs), then the rest; they run in file order. Each is journaled ``running`` when it
starts and ``done`` or ``failed`` when it ends, so ``qlift release status`` shows how long each took and, for
promote, where its rollout journal is. Each line is handed to ``report``, the pipeline's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from qlift.errors import QliftError
from qlift.release import live
from qlift.release.journal import ReleaseJournal, StageStatus
from qlift.release.kinds import TABLE
from qlift.release.livecontext import LivePlan, LiveRun
from qlift.release.livestages import LIVE_DOORS
from qlift.release.report import Action, StageReport, first_line, stage_key

Report = Callable[[StageReport], object]


def key_live(plan: LivePlan) -> LivePlan:
    """Key every live stage of ``plan``: the servers first, then the candidate's eval is found, then the rest."""
    servers = [s for s in plan.stages if TABLE[s.kind].serves]
    for s in servers:
        plan.keys[s.name] = stage_key(s.kind, s.options, LIVE_DOORS[s.kind].key_inputs(plan, s))
    plan.check_candidate_eval()
    for s in plan.stages:
        if s not in servers:
            plan.keys[s.name] = stage_key(s.kind, s.options, LIVE_DOORS[s.kind].key_inputs(plan, s))
    return plan


def run_live(plan: LivePlan, journal: ReleaseJournal, run_id: int, *, echo: Callable[[str], None],
             report: Report, caller_token: str | None = None) -> None:
    """Start the live stages in file order, each journaled and reported; stop what the run started.
    ``caller_token``: the caller's admin token of a running router the file names."""
    run = LiveRun(plan, journal, run_id, live.Processes(journal, run_id), live.new_router_token(), echo,
                  caller_token=caller_token)
    try:
        for s in plan.stages:
            t0 = time.monotonic()
            key = plan.keys[s.name]
            journal.begin(s.name, key, "")
            result = LIVE_DOORS[s.kind].start(run, s)
            journal.end(s.name, key, StageStatus.DONE, result=result)
            report(StageReport(s.name, s.kind, Action.RAN, plan.notes.get(s.name, ""), key,
                               seconds=round(time.monotonic() - t0, 2), result=result))
    except BaseException as exc:
        row = journal.stage(s.name, key)
        if row is not None and row.status is StageStatus.RUNNING:  # promote journals its failure with its result
            journal.end(s.name, key, StageStatus.FAILED, result={"error": first_line(exc)})
        if isinstance(exc, QliftError | KeyboardInterrupt):
            report(StageReport(s.name, s.kind, Action.FAILED, first_line(exc), key,
                               seconds=round(time.monotonic() - t0, 2)))
        raise
    finally:
        run.procs.stop()
