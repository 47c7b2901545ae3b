"""A controller's stops and resumes, journaled as events so that `status`, `--json` and the page tell them.

A controller that stops on a signal (SIGTERM, SIGINT/Ctrl-C) or an error journals ``controller_stopped`` with
how, where (state, step) and the weights it left, before the exception leaves it; the next controller on that
rollout journals ``controller_resumed`` (after a SIGKILL, which leaves no event, it says the stop went
unrecorded). ``interruptions`` pairs them for the status; ``live_weights`` reads what the router (or every router
of a fleet) holds now.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qlift.errors import ExternalToolError, QliftError, Terminated
from qlift.rollout.states import EventKind

if TYPE_CHECKING:
    from qlift.rollout.fleet import RouterFleet
    from qlift.rollout.journal import Journal
    from qlift.rollout.spec import RolloutSpec

STOPPED = EventKind.CONTROLLER_STOPPED
RESUMED = EventKind.CONTROLLER_RESUMED
UNRECORDED = "an unrecorded stop (SIGKILL, a crash or a reboot)"


def how_stopped(exc: BaseException) -> str:
    if isinstance(exc, Terminated):
        return "SIGTERM"
    if isinstance(exc, KeyboardInterrupt):
        return "SIGINT (Ctrl-C)"
    text = exc.one_line() if isinstance(exc, QliftError) else f"{type(exc).__name__}: {exc}"
    return "error: " + (text.splitlines() or [""])[0]


def _where(journal: Journal, rollout_id: int) -> dict[str, Any]:
    r = journal.get(rollout_id)
    last = journal.last_change(rollout_id)
    return {"state": r.state.value, "step": r.step, "steps": len(r.steps),
            "weights": None if last is None else last.weights,
            "applied": bool(last is not None and last.applied_at), "pid": os.getpid()}


@contextlib.contextmanager
def journaled_life(journal: Journal, rollout_id: int) -> Iterator[None]:
    """Journal a resume on entry (where the rollout ran before) and a stop on an exception; the exception goes
    on unchanged (a journal that cannot take the event never hides it)."""
    with contextlib.suppress(Exception):
        h = journal.history(rollout_id)
        ran_before = [e for e in h["events"] if e["kind"] in (STOPPED, RESUMED)] or h["weight_changes"]
        if ran_before:
            stops = [e for e in h["events"] if e["kind"] in (STOPPED, RESUMED)]
            after = stops[-1]["detail"]["how"] if stops and stops[-1]["kind"] == STOPPED else UNRECORDED
            journal.log_event(rollout_id, RESUMED, {"after": after, **_where(journal, rollout_id)})
    try:
        yield
    except BaseException as exc:
        with contextlib.suppress(Exception):
            if not journal.get(rollout_id).state.final:
                journal.log_event(rollout_id, STOPPED, {"how": how_stopped(exc), **_where(journal, rollout_id)})
        raise


@dataclass
class Interruption:
    """One stop of the controller, and the resume that followed it (None: not resumed yet)."""

    how: str
    stopped_at: str | None  # None: the stop left no event (SIGKILL), only the resume tells of it
    state: str
    step: int
    steps: int
    weights: dict[str, int] | None
    resumed_at: str | None = None
    resumed_pid: int | None = None

    def line(self) -> str:
        where = f"{self.state} at step {self.step + 1}/{self.steps}"
        if self.weights:
            where += " (" + " / ".join(f"{k} {v}%" for k, v in self.weights.items()) + ")"
        said = f"interrupted by {self.how} at {self.stopped_at[:19]}" if self.stopped_at else f"stopped by {self.how}"
        said = f"{said}, {where}"
        if self.resumed_at:
            said += f"; resumed at {self.resumed_at[:19]} (pid {self.resumed_pid})"
        return said


def interruptions(events: list[dict[str, Any]]) -> list[Interruption]:
    """The stops and resumes of a rollout's events, paired in order."""
    out: list[Interruption] = []
    for e in events:
        d = e["detail"]
        if e["kind"] == STOPPED:
            out.append(Interruption(d.get("how", "?"), e["at"], d.get("state", "?"), int(d.get("step", 0)),
                                    int(d.get("steps", 0)), d.get("weights")))
        elif e["kind"] == RESUMED:
            if not out or out[-1].resumed_at is not None:  # nothing journaled the stop: a SIGKILL or a crash
                out.append(Interruption(d.get("after", UNRECORDED), None, d.get("state", "?"), int(d.get("step", 0)),
                                        int(d.get("steps", 0)), d.get("weights")))
            out[-1].resumed_at, out[-1].resumed_pid = e["at"], d.get("pid")
    return out


def live_weights(spec: RolloutSpec, timeout: float = 3.0, *, router_token: str | None = None) -> dict[str, Any] | None:
    """What the qlift router holds now ({"url", "weights"} or {"url", "error"}); None for other data planes.
    ``router_token``: its admin token (None: QLIFT_ROUTER_TOKEN's). A fleet (``routers:``): see fleet_weights."""
    from qlift.rollout.fleet import RouterFleet
    from qlift.rollout.planes import PLANES

    fleet = RouterFleet.of(spec)
    if not PLANES[spec.data_plane].at_router or not (spec.router or fleet):
        return None
    from qlift.router.client import RouterClient
    from qlift.settings import router_token as given_or_env

    if fleet is not None:
        return fleet_weights(fleet, lambda url: dict(RouterClient(url, given_or_env(router_token),
                                                                  timeout=timeout).state().weights))
    assert spec.router is not None
    try:
        state = RouterClient(spec.router, given_or_env(router_token), timeout=timeout).state()
    except (QliftError, ValueError) as exc:
        return {"url": spec.router, "weights": None, "error": exc.one_line() if isinstance(exc, QliftError)
                else str(exc)}
    return {"url": spec.router, "weights": dict(state.weights), "error": None}


def fleet_weights(fleet: RouterFleet, read: Callable[[str], dict[str, int]]) -> dict[str, Any]:
    """What every router of a fleet holds now: {"url": the routers, "weights": the weights they all hold (None
    where one does not answer or they disagree), "error": why not, "routers": {url: {"weights", "error"}}}."""
    from qlift.rollout.fleet import not_answering

    def one(url: str) -> dict[str, int]:
        try:
            return read(url)
        except ValueError as exc:  # an answer that is not a router's state
            raise ExternalToolError(str(exc), tool="router") from None

    try:
        urls = fleet.urls()
    except QliftError as exc:  # discovery: the routers cannot be listed
        return {"url": fleet.where(), "weights": None, "error": exc.one_line(), "routers": {}}
    held, failed = fleet.each(urls, one)
    routers = {url: {"weights": held.get(url), "error": failed.get(url)} for url in urls}
    distinct = {tuple(sorted(w.items())) for w in held.values()}
    error = not_answering(failed) if failed else "the routers hold different weights" if len(distinct) > 1 else None
    weights = next(iter(held.values())) if error is None and held else None
    return {"url": ", ".join(urls), "weights": weights, "error": error, "routers": routers}
