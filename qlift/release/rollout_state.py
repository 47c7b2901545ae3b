"""`qlift release status`'s rollout: what the rollout's own journal says (its state, step, weights and the
controller's stops), what the router holds now, which of the release's servers still run, and what to do next.

The release journal only knows the promote stage ended (``Terminated`` after a SIGTERM); the rollout journal
knows it stopped at 50/50, progressing. A next step is suggested only where it can work: `promote resume` needs
the router and both servers answering and the router's token at hand (a router the release started had a token
nobody else knows: then the release is run again).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import NotRequired, TypedDict

from pydantic import JsonValue

from qlift.errors import QliftError
from qlift.release.journal import ReleaseJournal, RunRow
from qlift.release.spec import Release, RouterStageOptions, ServeStageOptions
from qlift.vllm.process import pid_alive


def answers(url: str, timeout: float = 2.0) -> bool:
    """Anything listens at ``url`` and answers HTTP (any status)."""
    import httpx

    try:
        httpx.get(url, timeout=timeout)
    except httpx.HTTPError:
        return False
    return True


def release_command(release: Release) -> str:
    out = f" --out {shlex.quote(str(release.out))}" if release.out_from == "--out" else ""
    return f"qlift release run {shlex.quote(str(release.file))}{out}"


def status_command(release: Release) -> str:
    return release_command(release).replace("qlift release run", "qlift release status", 1)


class LiveServer(TypedDict):
    """A live server stage of the last run (serve, router), as release status shows it."""

    stage: str
    kind: str
    url: str
    started_by_release: bool
    pid: int | None
    pid_alive: bool | None
    answers: bool
    role: NotRequired[str]  # a serve stage's: candidate or stable


class RolloutView(TypedDict):
    """The release's rollout, as release status shows it: its state, reason and journal, as the release journal
    has them; where the rollout's own journal is read, the rest too, and then the servers and what to run next."""

    state: str
    reason: str
    journal: str | None
    step: NotRequired[int]
    steps: NotRequired[int]
    weights: NotRequired[dict[str, int] | None]
    controller_running: NotRequired[bool]
    final: NotRequired[bool]
    interrupted: NotRequired[str | None]  # the controller's last stop, not resumed
    interruptions: NotRequired[list[str]]
    router: NotRequired[dict[str, JsonValue] | None]  # what the router holds now ({url, weights, error})
    servers: NotRequired[list[LiveServer]]
    next: NotRequired[list[str]]


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
        entry = LiveServer(stage=stage.name, kind=stage.kind, url=url, started_by_release=ours is not None, pid=pid,
                           pid_alive=None if pid is None else pid_alive(pid),
                           answers=bool(url) and answers(url.rstrip("/").removesuffix("/v1") + "/health"))
        if isinstance(stage.options, ServeStageOptions):
            entry["role"] = stage.options.role
        out.append(entry)
    return out


def rollout_from_journal(path: Path) -> RolloutView | None:
    """The rollout journal's latest rollout, as release status shows it (None: the journal holds none)."""
    from qlift.rollout.status import rollout_status

    try:
        st = rollout_status(path)
    except QliftError:
        return None
    stopped = st.interrupted
    return RolloutView(state=st.state.value, reason=st.reason, journal=str(path), step=st.step, steps=len(st.steps),
                       weights=st.weights, controller_running=st.controller.alive, final=st.final,
                       interrupted=None if stopped is None else stopped.line(),
                       interruptions=[i.line() for i in st.interruptions], router=st.live)


def next_steps(release: Release, rollout: RolloutView, live: list[LiveServer]) -> list[str]:
    """What to run now, each a command that works as printed (or says what must come first)."""
    journal = rollout.get("journal")
    if rollout.get("final") or rollout.get("controller_running") or not journal:
        return []
    flag = f" --journal {shlex.quote(journal)}"
    router = next((s for s in live if s["kind"] == "router"), None)
    gone = [s for s in live if s["kind"] == "serve" and not s["answers"]]
    if router is not None and router["started_by_release"]:
        how = "is gone" if not router["answers"] else "runs with an admin token only that run knew"
        return [f"the router this release started ({router['url']}) {how}: `{release_command(release)}` stops "
                "what the interrupted run left, starts the servers and the router again and rolls out from the "
                "first step"]
    if router is None or not router["answers"]:
        url = router["url"] if router else "the router"
        return [f"the router {url} does not answer: start it again, then `qlift promote abort{flag}` to return "
                f"every user to the stable, or `qlift promote resume{flag}` to go on"]
    if gone:
        names = ", ".join(f"{s['stage']} ({s['url']})" for s in gone)
        return [f"`qlift promote abort{flag}` returns every user to the stable now (QLIFT_ROUTER_TOKEN: the "
                f"router's token); {names} no longer answer{'s' if len(gone) == 1 else ''}: start "
                f"{'it' if len(gone) == 1 else 'them'} again, then `{release_command(release)}`"]
    return [f"`qlift promote resume{flag}` goes on at step {rollout['step'] + 1}/{rollout['steps']} (with "
            f"QLIFT_ROUTER_TOKEN set to the router's token), or `qlift promote abort{flag}` returns every user "
            "to the stable"]
