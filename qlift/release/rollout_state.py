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
from typing import Any

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


def servers(release: Release, journal: ReleaseJournal, run: RunRow | None) -> list[dict[str, Any]]:
    """Each live server stage of the last run (serve, router): its URL, who started it, whether it still runs."""
    started = {r["stage"]: r for r in journal.servers(run.id)} if run is not None else {}
    out = []
    for stage in release.stages:
        if not isinstance(stage.options, ServeStageOptions | RouterStageOptions):
            continue
        row = journal.latest(stage.name)
        result = row.result if row is not None else {}
        ours = started.get(stage.name)
        url = stage.options.url or result.get("url") or (ours or {}).get("url") or ""
        if not url and ours is None:
            continue  # never started
        pid = None if ours is None else int(ours["pid"])
        entry = {"stage": stage.name, "kind": stage.kind, "url": url, "started_by_release": ours is not None,
                 "pid": pid, "pid_alive": None if pid is None else pid_alive(pid),
                 "answers": bool(url) and answers(url.rstrip("/").removesuffix("/v1") + "/health")}
        if isinstance(stage.options, ServeStageOptions):
            entry["role"] = stage.options.role
        out.append(entry)
    return out


def rollout_from_journal(path: Path) -> dict[str, Any] | None:
    """The rollout journal's latest rollout, as release status shows it (None: the journal holds none)."""
    from qlift.rollout.status import rollout_status

    try:
        st = rollout_status(path)
    except QliftError:
        return None
    stopped = st.interrupted
    return {"state": st.state.value, "reason": st.reason, "journal": str(path), "step": st.step,
            "steps": len(st.steps), "weights": st.weights, "controller_running": st.controller.alive,
            "final": st.final, "interrupted": None if stopped is None else stopped.line(),
            "interruptions": [i.line() for i in st.interruptions], "router": st.live}


def next_steps(release: Release, rollout: dict[str, Any], live: list[dict[str, Any]]) -> list[str]:
    """What to run now, each a command that works as printed (or says what must come first)."""
    if rollout.get("final") or rollout.get("controller_running") or not rollout.get("journal"):
        return []
    flag = f" --journal {shlex.quote(rollout['journal'])}"
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
