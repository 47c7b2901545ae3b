"""The controller's states and reconcile loop with an in-memory data plane and scripted evidence:
the transition table, the fake clock, too little traffic pausing, drift re-applied, webhooks that
fail, aborts that cannot reach the plane or the disk, and journals that are not journals.
(The same against the real router process: test_rollout_state_router.py.)"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_rollout_journal import MemoryPlane, ScriptedEvidence, healthy, spec

import qlift.rollout.api as api
from qlift.errors import BadInputError, ExternalToolError, QliftError
from qlift.rollout import dataplane
from qlift.rollout.controller import Controller, Pace
from qlift.rollout.journal import Journal
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.states import TRANSITIONS, State


class FakeClock:
    """time.time and time.sleep for the controller: sleeping moves the clock, not the wall."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0
        self.slept = 0.0

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.slept += s


class DownPlane(MemoryPlane):
    """A plane that can be taken down: reading and setting weights fail while ``unreachable``."""

    def __init__(self) -> None:
        super().__init__()
        self.unreachable = False  # not `down`: that names ReportsDown's method

    def weights(self) -> dict[str, int] | None:
        if self.unreachable:
            raise ExternalToolError("router at http://127.0.0.1:1 did not answer", tool="router")
        return self.current

    def set_weights(self, weights: dict[str, int]) -> None:
        if self.unreachable:
            raise ExternalToolError("router at http://127.0.0.1:1 did not answer", tool="router")
        super().set_weights(weights)


def controller(journal: Journal, sp: RolloutSpec, plane: MemoryPlane, script: Any, clock: FakeClock | None = None,
               **kw: Any) -> tuple[Controller, int]:
    r = journal.create(sp.model_dump(mode="json"), sp.stable, sp.canary)
    clock = clock or FakeClock()
    ctl = Controller(journal, r.id, sp, plane, script, pace=Pace(tick=0.25, sleep=clock.sleep, clock=clock.time), **kw)
    return ctl, r.id


def run_until_10_percent(ctl: Controller, plane: MemoryPlane, *, tick_s: float) -> threading.Thread:
    """The controller on a thread with real (short) sleeps, once the plane holds the first step's weights."""
    ctl.sleep = lambda s: time.sleep(tick_s)
    t = threading.Thread(target=ctl.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while plane.current != {"s": 90, "c": 10} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert plane.current == {"s": 90, "c": 10}
    return t


def park(ctl: Controller) -> threading.Event:
    """Park the controller's thread in its next sleep; setting the returned event lets it go on."""
    gate, parked = threading.Event(), threading.Event()

    def gated(s: float) -> None:
        if not gate.is_set():
            parked.set()
            assert gate.wait(10)
        time.sleep(0.002)

    ctl.sleep = gated
    assert parked.wait(10)
    return gate


@pytest.fixture
def use_plane(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """api.* builds its data plane from the spec: hand it ours."""

    def use(plane: MemoryPlane) -> None:
        monkeypatch.setattr(dataplane, "make_data_plane", lambda s, router_token: plane)

    return use


# -- states -------------------------------------------------------------------------------------


def test_final_states_are_final_and_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(State)
    for s in State:
        assert (TRANSITIONS[s] == frozenset()) == s.final
    assert State.ABORTED in TRANSITIONS[State.ABORT_REQUESTED] and len(TRANSITIONS[State.ABORT_REQUESTED]) == 1


def test_transition_refuses_moves_the_table_lacks(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    r = journal.create(spec().model_dump(mode="json"), "s", "c")
    with journal.tx() as db:
        assert journal.transition(db, r.id, State.PROGRESSING, State.PROMOTED, "done")
    with pytest.raises(QliftError, match="not a valid transition"), journal.tx() as db:
        journal.transition(db, r.id, State.PROMOTED, State.PROGRESSING, "again")
    with journal.tx() as db:  # from a state it is not in: nothing happens
        assert not journal.transition(db, r.id, State.PAUSED, State.PROGRESSING, "resume")
    assert journal.get(r.id).state == "promoted"
    kinds = [(e["kind"], e["detail"]["to"]) for e in journal.history(r.id)["events"]]
    assert kinds == [("state", "promoted")]


def test_the_state_moves_only_through_transition(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    r = journal.create(spec().model_dump(mode="json"), "s", "c")
    with pytest.raises(QliftError, match="only through Journal.transition"), journal.tx() as db:
        journal.update(db, r.id, state=State.PROMOTED, holds=1)
    got = journal.get(r.id)
    assert got.state is State.PROGRESSING and got.holds == 0  # nothing of the refused update was written


def test_adapter_records_move_through_their_table(tmp_path: Path) -> None:
    from qlift.rollout.adapter import adapter_journal
    from qlift.rollout.states import ADAPTER_TRANSITIONS, AdapterState

    assert set(ADAPTER_TRANSITIONS) == set(AdapterState)
    assert {s for s in AdapterState if not ADAPTER_TRANSITIONS[s]} == {s for s in AdapterState if not s.open}
    with adapter_journal(tmp_path / "j.sqlite") as aj:
        rec = aj.add(name="a", path=tmp_path, server="http://127.0.0.1:1", content_hash="h", base_dir=None,
                     base_name=None, rollout_id=None)
        assert rec.state is AdapterState.LOADING
        rec = aj.move(aj.move(rec, AdapterState.LOADED), AdapterState.KEPT)
        with pytest.raises(QliftError, match="kept -> unloading is not a valid transition"):
            aj.move(rec, AdapterState.UNLOADING)
        assert aj.open_records() == [] and aj.get(rec.id).state is AdapterState.KEPT


# -- the clock ----------------------------------------------------------------------------------


def test_whole_rollout_under_a_fake_clock_takes_no_wall_time(tmp_path: Path) -> None:
    sp = spec(interval="30s")
    clock = FakeClock()
    plane = MemoryPlane()
    ctl, rid = controller(Journal(tmp_path / "j.sqlite"), sp, plane, ScriptedEvidence([(healthy("c", 20),
                                                                                        healthy("s", 80))]), clock)
    t0 = time.monotonic()
    final = ctl.run()
    wall = time.monotonic() - t0
    assert final.state == "promoted" and plane.applied[-1] == {"s": 0, "c": 100}
    assert clock.slept >= 60  # two 30 s windows, on the fake clock
    assert wall < 2.0, wall


# -- too little traffic -------------------------------------------------------------------------


def test_too_little_traffic_pauses_and_says_how_to_size_the_window(tmp_path: Path, use_plane) -> None:  # type: ignore[no-untyped-def]
    journal = Journal(tmp_path / "j.sqlite")
    plane = MemoryPlane()
    sp = spec(interval="30s")  # min_requests 5, max_inconclusive 2
    ctl, rid = controller(journal, sp, plane, ScriptedEvidence([(healthy("c", 1), healthy("s", 9))]))
    t = threading.Thread(target=ctl.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while journal.get(rid).state != "paused" and time.monotonic() < deadline:
        time.sleep(0.02)
    r = journal.get(rid)
    assert r.state == "paused" and plane.current == {"s": 90, "c": 10}  # never rolled back, weights kept
    for name in ("--interval", "--min-requests", "--max-inconclusive", "weight x requests/s x interval"):
        assert name in r.reason, r.reason
    assert "needs --interval >= " in r.reason
    plane.current = {"s": 100, "c": 0}  # someone resets the plane while the rollout is paused
    deadline = time.monotonic() + 10
    while plane.current != {"s": 90, "c": 10} and time.monotonic() < deadline:
        time.sleep(0.02)
    assert plane.current == {"s": 90, "c": 10}  # paused holds the journal's weights, it does not drop them
    use_plane(plane)
    api.abort(tmp_path / "j.sqlite")
    t.join(10)
    assert not t.is_alive() and journal.get(rid).state == "aborted"
    assert plane.current == {"s": 100, "c": 0}  # the controller's reconcile never undid the abort


# -- reconcile ----------------------------------------------------------------------------------


class DriftingEvidence(ScriptedEvidence):
    """Evidence whose first window sees the plane reset behind the controller's back (a restarted
    router comes back with its config weights)."""

    def __init__(self, plane: MemoryPlane, script: list[Any]) -> None:
        super().__init__(script)
        self.plane = plane
        self.began = 0

    def begin(self) -> None:
        self.began += 1
        if self.began == 1:
            self.plane.current = {"s": 100, "c": 0}


def test_drift_is_reapplied_and_the_window_is_no_evidence(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    plane = MemoryPlane()
    ev = DriftingEvidence(plane, [(healthy("c", 20), healthy("s", 80))])
    ctl, rid = controller(journal, spec(interval="30s"), plane, ev)
    final = ctl.run()
    assert final.state == "promoted"
    h = journal.history(rid)
    drift = [e for e in h["events"] if e["kind"] == "drift"]
    assert drift and drift[0]["detail"]["found"] == {"s": 100, "c": 0}
    assert drift[0]["detail"]["journaled"] == {"s": 90, "c": 10}
    assert [e["kind"] for e in h["events"]].count("window_discarded") == 1
    # the drifted window was not judged: 2 judged windows for 2 steps
    assert [w["action"] for w in h["windows"]] == ["advance", "advance"]
    assert plane.applied.count({"s": 90, "c": 10}) == 2  # set, then re-applied after the drift


def test_an_unreachable_plane_is_waited_for_not_judged(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    plane = DownPlane()
    clock = FakeClock()
    ev = ScriptedEvidence([(healthy("c", 20), healthy("s", 80))])
    ctl, rid = controller(journal, spec(interval="30s"), plane, ev, clock)
    original = clock.sleep
    calls = {"n": 0}

    def sleep(s: float) -> None:  # down for the first 50 sleeps of the second step, then back
        calls["n"] += 1
        if plane.current == {"s": 50, "c": 50} and calls["n"] < 10_000:
            plane.unreachable = calls["n"] % 200 < 50
        original(s)

    ctl.sleep = sleep
    final = ctl.run()
    assert final.state == "promoted"
    assert all(w["action"] == "advance" for w in journal.history(rid)["windows"])


# -- webhooks -----------------------------------------------------------------------------------


def test_malformed_webhook_url_is_refused_before_anything(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("promote", "start", "--router", "http://127.0.0.1:1", "--stable", "s", "--canary", "c",
                "--webhook", "http://[::1", "--journal", tmp_path / "j.sqlite")
    assert r.exit_code == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--webhook" in lines[0], lines
    assert not (tmp_path / "j.sqlite").exists()


def test_a_failing_webhook_never_ends_the_controller(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    sp = spec(interval="30s", webhook="http://[::1")  # a spec from an older journal: never validated
    plane = MemoryPlane()
    ctl, rid = controller(journal, sp, plane, ScriptedEvidence([(healthy("c", 20), healthy("s", 80))]))
    final = ctl.run()
    assert final.state == "promoted" and ctl.webhook_failures == 3
    failed = [e for e in journal.history(rid)["events"] if e["kind"] == "webhook_failed"]
    assert len(failed) == 3 and "InvalidURL" in failed[0]["detail"]["error"]


# -- abort --------------------------------------------------------------------------------------


def test_abort_against_a_dead_plane_stays_requested_until_it_converges(tmp_path: Path, use_plane) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    plane = DownPlane()
    use_plane(plane)
    r = journal.create(spec().model_dump(mode="json"), "s", "c")
    journal.change_weights(r.id, {"s": 50, "c": 50}, "step 2", plane.set_weights)
    plane.unreachable = True
    with pytest.raises(ExternalToolError, match="abort_requested"):
        api.abort(path)
    assert journal.get(r.id).state == "abort_requested" and plane.current == {"s": 50, "c": 50}
    with pytest.raises(ExternalToolError):  # still down: resume retries the abort, and says so
        api.resume(path)
    st = api.status(path)
    assert st["state"] == "abort_requested" and st["weights"] == {"s": 100, "c": 0} and not st["weights_applied"]
    plane.unreachable = False
    done = api.abort(path)
    assert done.state == "aborted" and plane.current == {"s": 100, "c": 0}
    assert api.status(path)["weights_applied"]
    with pytest.raises(QliftError, match="already aborted"):
        api.abort(path)


def test_a_running_controller_finishes_a_requested_abort(tmp_path: Path, use_plane) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    plane = DownPlane()
    use_plane(plane)
    ctl, rid = controller(journal, spec(interval="30s"), plane,
                          ScriptedEvidence([(healthy("c", 1), healthy("s", 9))]))
    t = run_until_10_percent(ctl, plane, tick_s=0.001)
    plane.unreachable = True
    with pytest.raises(ExternalToolError):
        api.abort(path)
    plane.unreachable = False  # the controller's next tick applies 100/0 and confirms
    t.join(10)
    assert not t.is_alive() and journal.get(rid).state == "aborted" and plane.current == {"s": 100, "c": 0}


def test_abort_on_a_full_journal_restores_weights_first(tmp_path: Path, use_plane,  # type: ignore[no-untyped-def]
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "j.sqlite"
    plane = MemoryPlane()
    use_plane(plane)
    journal = Journal(path)
    ctl, rid = controller(journal, spec(interval="30s"), plane, ScriptedEvidence([(healthy("c", 1),
                                                                                  healthy("s", 9))]))
    t = run_until_10_percent(ctl, plane, tick_s=0.002)
    # The disk is full: no page may be added to the journal (SQLITE_FULL, as on a full filesystem).
    full = {"on": True}
    configure = Journal._configure

    def capped(self: Journal, db: sqlite3.Connection) -> None:
        configure(self, db)
        if full["on"]:
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            db.execute(f"PRAGMA max_page_count = {pages}")

    monkeypatch.setattr(Journal, "_configure", capped)
    capped(journal, journal.db)  # the running controller's connection too
    filler = sqlite3.connect(path, isolation_level=None)
    capped(journal, filler)
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for _ in range(10_000):
            filler.execute("INSERT INTO events (rollout_id, at, kind, detail) VALUES (0, '', 'fill', ?)",
                           ("x" * 2000,))
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for _ in range(10_000):
            filler.execute("INSERT INTO decisions (rollout_id, at, step, action, reason) VALUES (0, '', 0, 'x', ?)",
                           ("x" * 2000,))
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for _ in range(10_000):
            filler.execute("INSERT INTO weight_changes (rollout_id, weights, reason, journaled_at) VALUES "
                           "(0, '{}', ?, '')", ("x" * 2000,))
    filler.close()
    api.abort(path)
    assert plane.current == {"s": 100, "c": 0}  # the weights came first
    st = api.status(path)
    assert st["abort_not_journaled"] and st["state"] == "abort_requested"
    time.sleep(0.3)
    assert plane.current == {"s": 100, "c": 0} and t.is_alive()  # the controller obeys it, and lives
    # The controller parks in its next sleep, so the `abort` below is what journals the abort, not it.
    gate = park(ctl)
    full["on"] = False
    journal.db.execute("PRAGMA max_page_count = 1073741823")
    with sqlite3.connect(path) as db:  # space returns
        db.execute("DELETE FROM events WHERE kind = 'fill'")
        db.execute("DELETE FROM decisions WHERE rollout_id = 0")
        db.execute("DELETE FROM weight_changes WHERE rollout_id = 0")
    assert api.abort(path).state == "aborted"  # journals it
    gate.set()
    t.join(10)
    assert journal.get(rid).state == "aborted" and not api.status(path)["abort_not_journaled"]
    assert "journal was full" in json.dumps(journal.history(rid)["events"])


def test_an_abort_the_full_journal_cannot_hold_is_not_undone_by_a_reconcile(tmp_path: Path) -> None:
    """The race a loaded CI run found in the test above: the abort set 100% stable, and a running controller's
    reconcile set the journal's 10% canary again before the abort's marker existed. The marker is written first,
    under the weights lock, and a reconcile that finds it leaves 100% stable standing."""
    from qlift.rollout.aborts import abort_with_full_journal
    from qlift.rollout.reconcile import Reconciler

    plane = MemoryPlane()
    journal = Journal(tmp_path / "j.sqlite")
    ctl, rid = controller(journal, spec(interval="30s"), plane, ScriptedEvidence([(healthy("c", 1),
                                                                                  healthy("s", 9))]))
    t = run_until_10_percent(ctl, plane, tick_s=0.002)
    gate = park(ctl)
    marker_when_set: list[bool] = []
    set_weights = plane.set_weights

    def recording(weights: dict[str, int]) -> None:
        marker_when_set.append(journal.abort_marker.exists())
        set_weights(weights)

    plane.set_weights = recording  # type: ignore[method-assign]
    abort_with_full_journal(journal, journal.get(rid), plane)
    assert marker_when_set == [True] and plane.current == {"s": 100, "c": 0}
    assert journal.last_change(rid).weights == {"s": 90, "c": 10}  # type: ignore[union-attr]  # the journal still says 10%
    assert Reconciler(journal, rid, plane).reconcile() is False and plane.current == {"s": 100, "c": 0}
    gate.set()
    t.join(10)
    assert journal.get(rid).state == State.ABORTED and plane.current == {"s": 100, "c": 0}


# -- journals that are not journals -------------------------------------------------------------


def _one_line_exit_2(run_cli, journal: Path, *args: str) -> str:  # type: ignore[no-untyped-def]
    r = run_cli("promote", *args, "--journal", journal)
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_foreign_and_corrupted_journals_are_one_line_exit_2(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO users (name) VALUES ('ada')")
    before = foreign.read_bytes()
    start = ("start", "--router", "http://127.0.0.1:1", "--stable", "s", "--canary", "c")
    assert "not a rollout journal" in _one_line_exit_2(run_cli, foreign, *start)
    assert "not a rollout journal" in _one_line_exit_2(run_cli, foreign, "status")
    with sqlite3.connect(foreign) as db:  # nothing of ours was written into it
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["users"]
    assert foreign.read_bytes() == before

    corrupt = tmp_path / "j.sqlite"
    with Journal(corrupt) as j:
        r = j.create(spec().model_dump(mode="json"), "s", "c")
        for i in range(200):
            with j.tx() as db:
                j.event(db, r.id, "filler", {"i": i, "pad": "x" * 200})
        j.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(corrupt.read_bytes())
    page = 4096
    assert len(data) > 8 * page
    data[5 * page + 8: 5 * page + 400] = b"\xff" * 392  # garbage over a b-tree page's cells
    corrupt.write_bytes(bytes(data))
    for args in (("status",), start):
        line = _one_line_exit_2(run_cli, corrupt, *args)
        assert "corrupt" in line or "malformed" in line, line

    text = tmp_path / "notes.txt"
    text.write_text("not a database at all\n" * 200)
    _one_line_exit_2(run_cli, text, "status")


def test_status_of_a_journal_still_being_created_is_no_rollout_yet(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`promote status` polled while a `promote start` (or `release run`) has created the file but not its tables
    (an AMX CI run caught the traceback, "no such table: rollouts"): exit 4, one line, and the file is left alone."""
    for journal in (tmp_path / "empty.sqlite", tmp_path / "wal.sqlite"):
        if journal.name == "empty.sqlite":
            journal.touch()
        else:
            with sqlite3.connect(journal) as db:  # what the writer's first statement leaves: WAL mode, no tables
                db.execute("PRAGMA journal_mode=WAL")
        before = journal.read_bytes()
        r = run_cli("promote", "status", "--journal", journal, "--json")
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 4 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0].startswith(f"error: no rollout in {journal} yet"), lines
        assert journal.read_bytes() == before


def test_status_reads_a_journal_nobody_may_write(tmp_path: Path) -> None:
    import os
    import shutil

    base = tmp_path / "ro"
    path = base / "j.sqlite"
    with Journal(path) as j:
        r = j.create(spec().model_dump(mode="json"), "s", "c")
        j.change_weights(r.id, {"s": 90, "c": 10}, "step 1", lambda w: None)
    path.chmod(0o444)
    base.chmod(0o555)
    # root ignores file modes: drop the capabilities that let it (as a user without them would be)
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot make a file read-only for this process")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    argv = [*prefix, sys.executable, "-m", "qlift", "promote", "status", "--journal", str(path), "--json"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        st = json.loads(done.stdout)
        assert st["state"] == "progressing" and st["weights"] == {"s": 90, "c": 10}
        assert st["controller"] == {"pid": None, "alive": False, "heartbeat_age_s": None, "stalled": False}
        done = subprocess.run([*argv[: len(prefix)], sys.executable, "-m", "qlift", "promote", "pause",
                               "--journal", str(path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "read-only" in done.stderr
    finally:
        base.chmod(0o755)
        path.chmod(0o644)


def test_unknown_versions_journal_nothing(tmp_path: Path, use_plane) -> None:  # type: ignore[no-untyped-def]
    class Plane(MemoryPlane):
        def check_versions(self, versions: list[str]) -> None:
            missing = [v for v in versions if v not in ("stable", "canary")]
            if missing:
                raise BadInputError(f"router has no backend named {', '.join(missing)}")

    use_plane(Plane())
    path = tmp_path / "j.sqlite"
    sp = RolloutSpec.model_validate({"stable": "stable", "canary": "canry", "router": "http://127.0.0.1:1"})
    with pytest.raises(BadInputError, match="canry"):
        api.start(sp, path)
    with Journal(path) as j:
        assert j.latest() is None
        assert j.db.execute("SELECT COUNT(*) FROM weight_changes").fetchone()[0] == 0


def test_promoted_journal_starts_nothing_without_new(tmp_path: Path, use_plane) -> None:  # type: ignore[no-untyped-def]
    plane = MemoryPlane()
    use_plane(plane)
    path = tmp_path / "j.sqlite"
    with Journal(path) as j:
        r = j.create(spec().model_dump(mode="json"), "s", "c")
        j.change_weights(r.id, {"s": 0, "c": 100}, "step 3", plane.set_weights)
        with j.tx() as db:
            j.transition(db, r.id, State.PROGRESSING, State.PROMOTED, "promoted")
    with pytest.raises(BadInputError, match="already promoted") as e:
        api.start(spec(), path)
    assert "Pass --new" in e.value.one_line()
    assert plane.applied == [{"s": 0, "c": 100}]
    with Journal(path) as j:
        assert j.latest().id == r.id  # type: ignore[union-attr]


# -- the docs -----------------------------------------------------------------------------------


def test_every_promote_command_in_the_docs_parses() -> None:
    """docs/promote.md's `qlift promote ...` lines (worked example included) name real flags and values."""
    import re
    import shlex

    import click

    from qlift.cli.main import cli

    text = (Path(__file__).resolve().parent.parent / "docs" / "promote.md").read_text(encoding="utf-8")
    seen = 0
    for block in re.findall(r"^```\w*\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        for raw in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", raw.strip().removeprefix("$ "))
            if not line.startswith("qlift promote ") or "|" in line or "..." in line:
                continue
            argv = shlex.split(line)[1:]
            group = cli.get_command(click.Context(cli), "promote")
            assert isinstance(group, click.Group)
            cmd = group.commands[argv[1]]
            cmd.make_context(f"qlift promote {argv[1]}", argv[2:])  # raises on an unknown flag or bad choice
            seen += 1
    assert seen >= 5, seen
