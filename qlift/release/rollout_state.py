"""`qlift release status`'s rollout: what the rollout's own journal says (its state, step, weights and the
controller's stops), what the router holds now, which of the release's servers still run, and what to do next.

The release journal only knows the promote stage ended (``Terminated`` after a SIGTERM); the rollout journal
knows it stopped at 50/50, progressing. A next step is suggested only where it can work: `promote resume` needs
the router and both servers answering and the router's token at hand (a router the release started had a token
nobody else knows: then the release is run again).
"""

from __future__ import annotations

import contextlib
import shlex
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import JsonValue

from qlift.errors import QliftError
from qlift.release.journal import ReleaseJournal, RunRow
from qlift.release.kinds import StageKind
from qlift.release.spec import Release, RouterStageOptions, ServeStageOptions
from qlift.vllm.process import pid_alive

if TYPE_CHECKING:
    from qlift.rollout.states import State
    from qlift.rollout.status import RolloutStatus


def answers(url: str, timeout: float = 2.0) -> bool:
    """Anything listens at ``url`` and answers HTTP (any status)."""
    import httpx

    from qlift import httpclient

    try:
        httpclient.get(url, timeout=timeout)
    except httpx.HTTPError:
        return False
    return True


def release_command(release: Release) -> str:
    out = f" --out {shlex.quote(str(release.out))}" if release.out_from == "--out" else ""
    return f"qlift release run {shlex.quote(str(release.file))}{out}"


def status_command(release: Release) -> str:
    return release_command(release).replace("qlift release run", "qlift release status", 1)


class PromoteShown(StrEnum):
    """The rollout's state, as release status shows it, where the promote stage's row holds none."""

    RUNNING = "running"  # the stage runs; its rollout's own journal tells more
    INTERRUPTED = "interrupted"  # journaled running by a run that was killed: nothing will finish it
    NOT_STARTED = "not started"  # it failed before the rollout began (e.g. the router refused it)


@dataclass(frozen=True)
class LiveServer:
    """A live server stage of the last run (a router; a serve stage's is a ``LiveServe``), as release status
    shows it."""

    stage: str
    kind: StageKind
    url: str
    started_by_release: bool
    pid: int | None
    pid_alive: bool | None
    answers: bool


@dataclass(frozen=True)
class LiveServe(LiveServer):
    """A serve stage's server, with its role: candidate or stable."""

    role: str


@dataclass(frozen=True)
class SaidRollout:
    """The release's rollout as the release journal's promote row has it (its own journal was not read)."""

    state: State | PromoteShown
    reason: str
    journal: str | None


@dataclass
class ReadRollout:
    """The release's rollout as its own journal has it: the rollout's typed status, which the text is rendered
    from, the release's live servers and what to run next. The fields between are read from ``status`` once, in
    the shape ``qlift release status --json`` prints."""

    status: RolloutStatus = field(repr=False, metadata={"json": False})
    state: State = field(init=False)
    reason: str = field(init=False)
    journal: str = field(init=False)
    step: int = field(init=False)
    steps: int = field(init=False)
    weights: dict[str, int] | None = field(init=False)
    controller_running: bool = field(init=False)
    final: bool = field(init=False)
    interrupted: str | None = field(init=False)  # the controller's last stop, not resumed
    interruptions: list[str] = field(init=False)
    router: dict[str, JsonValue] | None = field(init=False)  # what the router holds now ({url, weights, error})
    servers: list[LiveServer] = field(default_factory=list)
    next: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        st = self.status
        self.state, self.reason, self.journal, self.step, self.steps = \
            st.state, st.reason, st.journal, st.step, len(st.steps)
        self.weights, self.controller_running, self.final = st.weights, st.controller.alive, st.final
        self.interrupted = None if st.interrupted is None else st.interrupted.line()
        self.interruptions = [i.line() for i in st.interruptions]
        self.router = st.live


def servers(release: Release, journal: ReleaseJournal, run: RunRow | None) -> list[LiveServer]:
    """Each live server stage of the last run (serve, router): its URL, who started it, whether it still runs."""
    started = {r["stage"]: r for r in journal.servers(run.id)} if run is not None else {}
    out: list[LiveServer] = []
    for stage in release.stages:
        if not isinstance(stage.options, ServeStageOptions | RouterStageOptions):
            continue
        row = journal.latest(stage.name)
        journaled = row.result.get("url") if row is not None else None
        ours = started.get(stage.name)
        url = stage.options.url or (journaled if isinstance(journaled, str) else "") or \
            (ours["url"] if ours is not None else "")
        if not url and ours is None:
            continue  # never started
        pid = None if ours is None else ours["pid"]
        seen = (stage.name, stage.kind, url, ours is not None, pid, None if pid is None else pid_alive(pid),
                bool(url) and answers(url.rstrip("/").removesuffix("/v1") + "/health"))
        out.append(LiveServe(*seen, role=stage.options.role) if isinstance(stage.options, ServeStageOptions)
                   else LiveServer(*seen))
    return out


def rollout_from_journal(path: Path) -> RolloutStatus | None:
    """The rollout journal's latest rollout (None: the journal holds none)."""
    from qlift.rollout.status import rollout_status

    try:
        return rollout_status(path)
    except QliftError:
        return None


def owed_retirements(release: Release) -> list[str]:
    """A ``next:`` release's old version still on the router at weight 0, where its run could not retire it (the
    router did not answer, the run was killed): the next `release run` retires it first (pipeline)."""
    from qlift.release.livecontext import rollout_journals
    from qlift.rollout.train import unretired

    out = []
    for journal in rollout_journals(release.out):
        with contextlib.suppress(QliftError):
            if (name := unretired(journal)) is not None:
                out.append(f"backend {name} is still on the router at weight 0 (its rollout in {journal} ended; the "
                           f"retirement did not): `{release_command(release)}` retires it before anything else")
    return out


def next_steps(release: Release, st: RolloutStatus, live: list[LiveServer]) -> list[str]:
    """What to run now, each a command that works as printed (or says what must come first)."""
    if st.final:
        return owed_retirements(release)
    if st.controller.alive or not st.journal:
        return []
    flag = f" --journal {shlex.quote(st.journal)}"
    router = next((s for s in live if s.kind is StageKind.ROUTER), None)
    gone = [s for s in live if s.kind is StageKind.SERVE and not s.answers]
    if router is not None and router.started_by_release:
        how = "is gone" if not router.answers else "runs with an admin token only that run knew"
        return [f"the router this release started ({router.url}) {how}: `{release_command(release)}` stops "
                "what the interrupted run left, starts the servers and the router again and rolls out from the "
                "first step"]
    if router is None or not router.answers:
        url = router.url if router else "the router"
        return [f"the router {url} does not answer: start it again, then `qlift promote abort{flag}` to return "
                f"every user to the stable, or `qlift promote resume{flag}` to go on"]
    if gone:
        names = ", ".join(f"{s.stage} ({s.url})" for s in gone)
        return [f"`qlift promote abort{flag}` returns every user to the stable now (QLIFT_ROUTER_TOKEN: the "
                f"router's token); {names} no longer answer{'s' if len(gone) == 1 else ''}: start "
                f"{'it' if len(gone) == 1 else 'them'} again, then `{release_command(release)}`"]
    return [f"`qlift promote resume{flag}` goes on at step {st.step + 1}/{len(st.steps)} (with "
            f"QLIFT_ROUTER_TOKEN set to the router's token), or `qlift promote abort{flag}` returns every user "
            "to the stable"]
