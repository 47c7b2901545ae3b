"""A window whose evidence source failed is an error, not an inconclusive window: it counts toward
``analysis.consecutive_error_limit`` windows in a row (Argo Rollouts' consecutiveErrorLimit), apart from
``max_inconclusive``; any measured window starts the count again; one error more than the limit rolls back;
the count is journaled, so a controller killed with SIGKILL is replaced by one that keeps it. The controller
runs on the fake clock: a 30 s window passes in microseconds."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

from test_rollout_journal import MemoryPlane, healthy
from test_rollout_state import FakeClock

from qlift.errors import ExternalToolError
from qlift.rollout.analysis import error_limit
from qlift.rollout.controller import Controller, Pace
from qlift.rollout.evidence import Evidence
from qlift.rollout.journal import Journal
from qlift.rollout.spec import RolloutSpec

DOWN = "down"  # a window whose evidence source does not answer
GOOD = (healthy("c", 20), healthy("s", 80))


class Outage:
    """The evidence source, scripted a window at a time: DOWN (the router's request log unreachable) or
    (canary, stable) evidence. The window at ``hang_at`` never ends: its process is killed in it."""

    def __init__(self, clock: FakeClock, script: list[Any], hang_at: int | None = None,
                 marker: Path | None = None) -> None:
        self.clock, self.script, self.hang_at, self.marker = clock, script, hang_at, marker
        self.windows, self.started = 0, 0.0

    def begin(self) -> None:
        self.started = self.clock.now

    def peek(self) -> None:
        return None

    def collect(self) -> Evidence:
        i, self.windows = self.windows, self.windows + 1
        if i == self.hang_at and self.marker is not None:
            self.marker.write_text("in the window")
            time.sleep(60)
        item = self.script[min(i, len(self.script) - 1)]
        if item == DOWN:
            raise ExternalToolError("router at http://127.0.0.1:1 did not answer", tool="router")
        canary, stable = item
        return Evidence(stable, canary, self.started, self.clock.now, "router")


def _spec(**analysis: Any) -> RolloutSpec:
    return RolloutSpec.model_validate({
        "stable": "s", "canary": "c", "router": "http://127.0.0.1:1", "interval": "30s", "steps": [10, 100],
        "analysis": {"min_requests": 5, "max_inconclusive": 1, "consecutive_error_limit": 3, **analysis}})


def _run(journal: Journal, rid: int, sp: RolloutSpec, source: Outage, clock: FakeClock,
         plane: MemoryPlane | None = None) -> Any:
    return Controller(journal, rid, sp, plane or MemoryPlane(), source,  # type: ignore[arg-type]
                      pace=Pace(sleep=clock.sleep, clock=clock.time)).run()


def test_errors_in_a_row_hold_up_to_the_limit_apart_from_inconclusive_and_a_measured_window_resets(
        tmp_path: Path) -> None:
    # limit 3: three errors hold, the fourth in a row rolls back; max_inconclusive 1 would have acted on the
    # second if errors still held toward it. A passing window between the streaks starts the count again.
    sp = _spec(intervals_per_step=2)
    journal, clock = Journal(tmp_path / "j.sqlite"), FakeClock()
    rid = journal.create(sp.model_dump(mode="json"), "s", "c").id
    final = _run(journal, rid, sp, Outage(clock, [DOWN, DOWN, DOWN, GOOD, DOWN, DOWN, DOWN, DOWN]), clock)
    h = journal.history(rid)
    assert [d["action"] for d in h["decisions"]] == ["start", "hold", "hold", "hold", "pass", "hold", "hold", "hold",
                                                     "rollback"]
    assert final.state == "rolled_back"
    assert final.reason.startswith("no evidence for 4 windows in a row (consecutive_error_limit 3): the evidence "
                                   "source failed: router at http://127.0.0.1:1 did not answer"), final.reason
    assert all("evidence source failed" in w["notes"][0] for w in h["windows"] if w["action"] == "hold")
    assert (final.holds, final.errors) == (0, 4)  # no error window was an inconclusive hold


def test_the_default_limit_is_max_inconclusive(tmp_path: Path) -> None:
    sp = _spec(consecutive_error_limit=None, max_inconclusive=2)
    assert error_limit(sp.analysis) == 2
    journal, clock = Journal(tmp_path / "j.sqlite"), FakeClock()
    rid = journal.create(sp.model_dump(mode="json"), "s", "c").id
    final = _run(journal, rid, sp, Outage(clock, [DOWN]), clock)
    assert [d["action"] for d in journal.history(rid)["decisions"]] == ["start", "hold", "hold", "rollback"]
    assert "consecutive_error_limit 2" in final.reason


def _controller_until_killed(journal_path: str, spec: dict[str, Any], hang_at: int, marker: str) -> None:
    """A controller process whose evidence source is down, until it is killed inside window ``hang_at``."""
    clock = FakeClock()
    with Journal(Path(journal_path)) as journal:
        _run(journal, 1, RolloutSpec.model_validate(spec), Outage(clock, [DOWN], hang_at, Path(marker)), clock)


def test_a_controller_killed_with_sigkill_is_replaced_by_one_that_keeps_the_count(tmp_path: Path) -> None:
    sp = _spec()
    path, marker = tmp_path / "j.sqlite", tmp_path / "in-window-3"
    with Journal(path) as journal:
        rid = journal.create(sp.model_dump(mode="json"), "s", "c").id
    child = multiprocessing.get_context("spawn").Process(
        target=_controller_until_killed, args=(str(path), sp.model_dump(mode="json"), 2, str(marker)))
    child.start()
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and child.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), "the controller never reached its third window"
        os.kill(child.pid or 0, signal.SIGKILL)
    finally:
        child.join(10)
    assert child.exitcode == -signal.SIGKILL
    journal, clock = Journal(path), FakeClock()
    r = journal.get(rid)
    assert (r.errors, r.holds) == (2, 0) and [d["action"] for d in journal.history(rid)["decisions"]] == [
        "start", "hold", "hold"]
    # the new controller counts on from 2: its first error is the third in a row, its second the fourth
    final = _run(journal, rid, sp, Outage(clock, [DOWN]), clock, MemoryPlane())
    assert [d["action"] for d in journal.history(rid)["decisions"]] == ["start", "hold", "hold", "hold", "rollback"]
    assert final.state == "rolled_back" and "no evidence for 4 windows in a row" in final.reason


def test_a_journal_of_an_older_qlift_gets_the_count(tmp_path: Path) -> None:
    """A journal without the errors column (written before it existed) reads as 0 errors, and gains the column
    the first time it is opened for writing."""
    import sqlite3

    path = tmp_path / "j.sqlite"
    sp = _spec()
    with Journal(path) as journal:
        rid = journal.create(sp.model_dump(mode="json"), "s", "c").id
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE rollouts DROP COLUMN errors")
    with Journal(path, readonly=True) as old:
        assert old.get(rid).errors == 0
    with Journal(path) as journal:
        with journal.tx() as db:
            journal.update(db, rid, errors=2)
        assert journal.get(rid).errors == 2


class ShadowOutage:
    """The router's shadow pairs with its ring unreadable (DOWN) or ``n`` identical pairs, a window at a time."""

    def __init__(self, clock: FakeClock, script: list[Any]) -> None:
        from rollout_journals import ClockedShadow

        self.good, self.script, self.windows = ClockedShadow(clock, [12]), script, 0

    def start(self, version: str, percent: float, max_inflight: int) -> dict[str, Any]:
        return {}

    def stop(self) -> None:
        pass

    def begin(self) -> None:
        self.good.begin()

    def collect(self) -> Any:
        i, self.windows = self.windows, self.windows + 1
        if self.script[min(i, len(self.script) - 1)] == DOWN:
            raise ExternalToolError("router at http://127.0.0.1:1 did not answer GET /admin/shadow", tool="router")
        return self.good.collect()


def test_a_shadow_phase_without_pairs_counts_errors_and_rolls_back_past_the_limit(tmp_path: Path) -> None:
    """The shadow ring unreadable is no pass and no endless retry: the same limit as a split window's."""
    from qlift.rollout.states import State

    sp = RolloutSpec.model_validate({**_spec().model_dump(mode="json"),
                                     "shadow": {"percent": 20, "windows": 2, "min_pairs": 8}})
    journal, clock = Journal(tmp_path / "j.sqlite"), FakeClock()
    rid = journal.create(sp.model_dump(mode="json"), "s", "c", state=State.SHADOWING).id
    source = ShadowOutage(clock, [DOWN, "ok", DOWN, DOWN, DOWN, DOWN])
    final = Controller(journal, rid, sp, MemoryPlane(), Outage(clock, [GOOD]),  # type: ignore[arg-type]
                       pace=Pace(sleep=clock.sleep, clock=clock.time), shadow_source=source).run()
    h = journal.history(rid)
    assert [d["action"] for d in h["decisions"]][1:] == ["hold", "pass", "hold", "hold", "hold", "rollback"]
    assert final.state == "rolled_back" and final.errors == 4
    assert final.reason.startswith("shadow phase: no evidence for 4 windows in a row (consecutive_error_limit 3)")
    assert source.windows == 6
