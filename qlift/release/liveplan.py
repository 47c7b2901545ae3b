"""The live stages' keys and run: serve, router and promote, keyed and journaled together.

Each live stage goes through its door (``qlift.release.livestages.LIVE_DOORS``): the servers are keyed first (the
others' keys are made of theirs), then the rest. A running server or router the file names by ``url:`` is checked
to answer before anything starts; the servers start together (each on its own core where the file says so), then
the router and promote run in file order. Each is journaled ``running`` when it
starts and ``done`` or ``failed`` when it ends, so ``qlift release status`` shows how long each took and, for
promote, where its rollout journal is. Each line is handed to ``report``, the pipeline's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pydantic import JsonValue

from qlift.errors import ExternalToolError, QliftError
from qlift.release import live
from qlift.release.journal import ReleaseJournal, StageStatus
from qlift.release.kinds import TABLE, StageKind
from qlift.release.livecontext import LivePlan, LiveRun, rollout_journal
from qlift.release.livestages import LIVE_DOORS
from qlift.release.report import Action, StageReport, first_line, stage_key
from qlift.release.spec import RouterStageOptions, ServeStageOptions, Stage

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
    """Check that every server and router the file names by ``url:`` answers, start the servers together, then
    the other live stages in file order, each journaled and reported; stop what the run started.
    ``caller_token``: the caller's admin token of a running router the file names."""
    run = LiveRun(plan, journal, run_id, live.Processes(journal, run_id), live.new_router_token(), echo,
                  caller_token=caller_token)
    held = threading.Event()
    try:
        _check_urls(run, report)
        servers = [s for s in plan.stages if TABLE[s.kind].serves]
        _start_servers(run, servers, report, held)
        for s in plan.stages:
            if s not in servers:
                _run_stage(run, s, report)
    finally:
        run.procs.stop()
        held.set()


def url_problem(stage: Stage) -> str | None:
    """Why the running server or router a stage names by ``url:`` cannot be used (None: it answers, or the
    stage names none)."""
    o = stage.options
    if isinstance(o, ServeStageOptions) and o.url:
        return live.server_problem(o.url)
    if isinstance(o, RouterStageOptions) and o.url:
        return live.router_problem(o.url)
    return None


def _check_urls(run: LiveRun, report: Report) -> None:
    """Before anything starts: a stage that names a running server or router by ``url:`` fails here where
    nothing answers there as one, in one line naming the URL and the fix."""
    for s in run.plan.stages:
        problem = url_problem(s)
        if problem is None:
            continue
        key = run.plan.keys[s.name]
        run.journal.begin(s.name, key, "")
        run.journal.end(s.name, key, StageStatus.FAILED, result={"error": problem})
        report(StageReport(s.name, s.kind, Action.FAILED, problem, key))
        what = "vLLM server (`qlift serve MODEL --port PORT`)" if s.kind is StageKind.SERVE else \
            "qlift router (`qlift router --port PORT ...`)"
        raise ExternalToolError(f"stage '{s.name}': {problem}",
                                hint=f"Start the {what} at that URL, or fix the stage's url: in "
                                     f"{run.plan.release.file}; nothing was started.",
                                tool="vllm" if s.kind is StageKind.SERVE else "router")


def _start_servers(run: LiveRun, stages: list[Stage], report: Report, held: threading.Event) -> None:
    """Start the serve stages' servers together, each bound as its options say, and wait for all of them; each is
    journaled and reported in file order, the first failure raised once every start has ended. Each start runs
    in a thread that lives until the run ends (``held``): vLLM is SIGTERMed when the thread that started it
    exits (PR_SET_PDEATHSIG), which is what a killed release needs and a finished thread must not do."""
    keys = run.plan.keys
    for s in stages:
        run.journal.begin(s.name, keys[s.name], "")
    ended: dict[str, tuple[dict[str, JsonValue] | BaseException, float]] = {}
    done = threading.Semaphore(0)

    def start(s: Stage) -> None:
        t0 = time.monotonic()
        try:
            got: dict[str, JsonValue] | BaseException = LIVE_DOORS[s.kind].start(run, s)
        except BaseException as exc:  # handed to the main thread, which raises it
            got = exc
        ended[s.name] = (got, round(time.monotonic() - t0, 2))
        done.release()
        held.wait()

    for s in stages:
        threading.Thread(target=start, args=(s,), name=f"release-{s.name}", daemon=True).start()
    try:
        for _ in stages:
            while not done.acquire(timeout=0.5):  # a timeout, so a signal (Ctrl-C, SIGTERM) gets through
                pass
    except BaseException as exc:
        for s in stages:
            if s.name not in ended:
                run.journal.end(s.name, keys[s.name], StageStatus.FAILED, result={"error": first_line(exc)})
        raise
    failure: BaseException | None = None
    for s in stages:
        got, took = ended[s.name]
        if isinstance(got, BaseException):
            run.journal.end(s.name, keys[s.name], StageStatus.FAILED, result={"error": first_line(got)})
            if isinstance(got, QliftError | KeyboardInterrupt):
                report(StageReport(s.name, s.kind, Action.FAILED, first_line(got), keys[s.name], seconds=took))
            failure = failure or got
            continue
        run.journal.end(s.name, keys[s.name], StageStatus.DONE, result=got)
        report(StageReport(s.name, s.kind, Action.RAN, run.plan.notes.get(s.name, ""), keys[s.name], seconds=took,
                           result=got))
    if failure is not None:
        raise failure


def _run_stage(run: LiveRun, s: Stage, report: Report) -> None:
    """One live stage (the router, promote), journaled running, then done or failed, and reported."""
    t0 = time.monotonic()
    key = run.plan.keys[s.name]
    run.journal.begin(s.name, key, "")
    try:
        result = LIVE_DOORS[s.kind].start(run, s)
    except BaseException as exc:
        row = run.journal.stage(s.name, key)
        if row is not None and row.status is StageStatus.RUNNING:  # promote journals its failure with its result
            failed: dict[str, JsonValue] = {"error": first_line(exc)}
            if TABLE[s.kind].moves_traffic:  # where its rollout is, for status and for following it
                failed["journal"] = str(rollout_journal(run.plan.release.out, run.run_id))
            run.journal.end(s.name, key, StageStatus.FAILED, result=failed)
        if isinstance(exc, QliftError | KeyboardInterrupt):
            report(StageReport(s.name, s.kind, Action.FAILED, first_line(exc), key,
                               seconds=round(time.monotonic() - t0, 2)))
        raise
    run.journal.end(s.name, key, StageStatus.DONE, result=result)
    report(StageReport(s.name, s.kind, Action.RAN, run.plan.notes.get(s.name, ""), key,
                       seconds=round(time.monotonic() - t0, 2), result=result))
