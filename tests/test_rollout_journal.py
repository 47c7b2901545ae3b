"""Spec validation, the journal's write-ahead weight changes, and the controller's decisions
driven by scripted evidence (the real-server paths are in test_promote*.py)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from qlift.errors import BadInputError, ExternalToolError
from qlift.rollout.controller import Controller, Pace
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.journal import Journal
from qlift.rollout.spec import RolloutSpec, build_spec, parse_duration, read_spec_file


class MemoryPlane:
    kind = "memory"

    def __init__(self) -> None:
        self.current: dict[str, int] | None = None
        self.applied: list[dict[str, int]] = []
        self.fail_next = False

    def weights(self) -> dict[str, int] | None:
        return self.current

    def set_weights(self, weights: dict[str, int]) -> None:
        if self.fail_next:
            self.fail_next = False
            raise ExternalToolError("data plane down", tool="test")
        self.current = dict(weights)
        self.applied.append(dict(weights))

    def backend_urls(self) -> dict[str, str]:
        return {}


class ScriptedEvidence:
    """Hands out one Evidence per window from a list of (canary, stable) builders."""

    def __init__(self, script: list[tuple[VersionEvidence, VersionEvidence]]) -> None:
        self.script = list(script)
        self.windows = 0

    def begin(self) -> None:
        pass

    def peek(self) -> None:
        return None

    def collect(self) -> Evidence:
        canary, stable = self.script[min(self.windows, len(self.script) - 1)]
        self.windows += 1
        return Evidence(stable, canary, time.time() - 1, time.time(), "scripted")


def healthy(version: str, n: int) -> VersionEvidence:
    return VersionEvidence(version, requests=n, errors=0, latency_s=[0.5 + i * 0.001 for i in range(n)],
                           ttft_s=[0.1] * n, completion_tokens=[20.0] * n, finishes=n, length_finishes=0,
                           completions=n, completion_tokens_sum=20.0 * n, empty=0)


def failing(version: str, n: int) -> VersionEvidence:
    return VersionEvidence(version, requests=n, errors=n)


def spec(**kw: object) -> RolloutSpec:
    base = {"stable": "s", "canary": "c", "router": "http://127.0.0.1:1", "interval": 0.05,
            "analysis": {"min_requests": 5, "max_inconclusive": 2}}
    return RolloutSpec.model_validate({**base, **kw})


def run(tmp_path: Path, sp: RolloutSpec, script: list[tuple[VersionEvidence, VersionEvidence]],
        plane: MemoryPlane | None = None):  # type: ignore[no-untyped-def]
    plane = plane or MemoryPlane()
    journal = Journal(tmp_path / "j.sqlite")
    r = journal.create(sp.model_dump(mode="json"), sp.stable, sp.canary)
    final = Controller(journal, r.id, sp, plane, ScriptedEvidence(script), pace=Pace(tick=0.01)).run()  # type: ignore[arg-type]
    return final, plane, journal


# -- spec -------------------------------------------------------------------------------


def test_durations() -> None:
    assert parse_duration("30s") == 30 and parse_duration("2m") == 120 and parse_duration("500ms") == 0.5
    assert parse_duration(4) == 4
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_spec_errors_name_the_file_and_field(tmp_path: Path) -> None:
    f = tmp_path / "rollout.yaml"
    f.write_text("stable: s\ncanary: c\nrouter: http://x:1\nanalysis:\n  max_error_rat: 0.1\n")
    with pytest.raises(BadInputError) as e:
        build_spec(read_spec_file(f), {}, path=f)
    assert str(f) in e.value.one_line() and "analysis.max_error_rat" in e.value.one_line()
    f.write_text("stable: s\ncanary: c\nrouter: http://x:1\nsteps: [10, 50]\n")
    with pytest.raises(BadInputError, match="must end at 100"):
        build_spec(read_spec_file(f), {}, path=f)


def test_flags_override_the_file_and_are_named_when_wrong(tmp_path: Path) -> None:
    f = tmp_path / "rollout.yaml"
    f.write_text("stable: s\ncanary: c\nrouter: http://x:1\ninterval: 1m\nanalysis: {min_requests: 50}\n")
    sp = build_spec(read_spec_file(f), {"interval": "5s", "analysis.max_error_rate": 0.2}, path=f)
    assert sp.interval == 5 and sp.analysis.min_requests == 50 and sp.analysis.max_error_rate == 0.2
    with pytest.raises(BadInputError, match="--interval"):
        build_spec(read_spec_file(f), {"interval": "soon"}, path=f)


def test_bad_spec_exits_2_with_one_line(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "rollout.yaml"
    f.write_text("stable: s\ncanary: c\nrouter: http://127.0.0.1:1\nsteps: [10, 50, 100]\nintervall: 5s\n")
    result = run_cli("promote", "start", "-f", f, "--journal", tmp_path / "j.sqlite")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{f}: field 'intervall'" in lines[0], lines


# -- journal ----------------------------------------------------------------------------


def test_weight_change_is_journaled_before_it_is_applied(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    r = journal.create(spec().model_dump(mode="json"), "s", "c")
    seen: list[dict[str, object]] = []

    def apply(weights: dict[str, int]) -> None:
        # Another connection (another process, after a crash) must already see the intent.
        other = sqlite3.connect(tmp_path / "j.sqlite")
        row = other.execute("SELECT weights, applied_at FROM weight_changes ORDER BY id DESC LIMIT 1").fetchone()
        seen.append({"weights": json.loads(row[0]), "applied_at": row[1]})
        other.close()

    assert journal.change_weights(r.id, {"s": 90, "c": 10}, "step 1", apply)
    assert seen == [{"weights": {"s": 90, "c": 10}, "applied_at": None}]
    last = journal.last_change(r.id)
    assert last is not None and last.applied_at is not None
    assert journal.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_failed_apply_leaves_an_intent_that_is_applied_on_recovery(tmp_path: Path) -> None:
    plane = MemoryPlane()
    journal = Journal(tmp_path / "j.sqlite")
    r = journal.create(spec().model_dump(mode="json"), "s", "c")
    plane.fail_next = True
    with pytest.raises(ExternalToolError):
        journal.change_weights(r.id, {"s": 50, "c": 50}, "step 2", plane.set_weights)
    pending = journal.last_change(r.id)
    assert pending is not None and pending.applied_at is None and plane.current is None
    assert journal.reapply_pending(r.id, plane.set_weights) is not None
    assert plane.current == {"s": 50, "c": 50}
    last = journal.last_change(r.id)
    assert last is not None and last.applied_at is not None


# -- the controller ---------------------------------------------------------------------


def test_healthy_canary_is_promoted_step_by_step(tmp_path: Path) -> None:
    final, plane, journal = run(tmp_path, spec(), [(healthy("c", 20), healthy("s", 80))])
    assert final.state == "promoted" and final.desired_version == "c"
    assert plane.applied == [{"s": 90, "c": 10}, {"s": 50, "c": 50}, {"s": 0, "c": 100}]
    h = journal.history(final.id)
    assert [s["outcome"] for s in h["steps"]] == ["passed", "passed", "promoted"]
    assert [d["action"] for d in h["decisions"]] == ["start", "advance", "advance", "promoted"]
    assert all(c["applied_at"] for c in h["weight_changes"])


def test_failing_canary_is_rolled_back_with_p_values(tmp_path: Path) -> None:
    final, plane, journal = run(tmp_path, spec(), [(failing("c", 8), healthy("s", 80))])
    assert final.state == "rolled_back" and final.desired_version == "s"
    assert plane.current == {"s": 100, "c": 0}
    rollback = journal.history(final.id)["decisions"][-1]
    assert rollback["action"] == "rollback" and rollback["p_values"]["error_rate"] < 0.001


def test_too_little_traffic_rolls_back_only_when_asked(tmp_path: Path) -> None:
    # The default (pause) is in test_rollout_state.py; on_insufficient: rollback keeps the old behaviour.
    sp = spec(analysis={"min_requests": 5, "max_inconclusive": 2, "on_insufficient": "rollback"})
    final, plane, journal = run(tmp_path, sp, [(healthy("c", 0), healthy("s", 80))])
    actions = [d["action"] for d in journal.history(final.id)["decisions"]]
    assert actions == ["start", "hold", "hold", "rollback"]
    assert final.state == "rolled_back" and "too little canary traffic" in final.reason
    assert plane.current == {"s": 100, "c": 0}


def test_held_windows_carry_their_evidence_into_the_next(tmp_path: Path) -> None:
    # 2 canary requests a window, min_requests 5: the third window judges 6 requests and passes.
    final, _, journal = run(tmp_path, spec(steps=[10, 100]), [(healthy("c", 2), healthy("s", 30))])
    h = journal.history(final.id)
    assert [d["action"] for d in h["decisions"]] == ["start", "hold", "hold", "advance", "promoted"]
    last = h["windows"][-1]
    assert last["canary"]["requests"] == 6 and last["notes"] == ["cumulative over 3 windows of this step"]


class BrokenEvidence(ScriptedEvidence):
    def collect(self) -> Evidence:
        raise ExternalToolError("router at http://127.0.0.1:1 did not answer", tool="router")


def test_an_evidence_outage_holds_and_never_passes(tmp_path: Path) -> None:
    sp = spec()
    plane = MemoryPlane()
    journal = Journal(tmp_path / "j.sqlite")
    r = journal.create(sp.model_dump(mode="json"), "s", "c")
    final = Controller(journal, r.id, sp, plane, BrokenEvidence([]), pace=Pace(tick=0.01)).run()  # type: ignore[arg-type]
    h = journal.history(r.id)
    assert [d["action"] for d in h["decisions"]] == ["start", "hold", "hold", "rollback"]
    assert final.state == "rolled_back" and plane.current == {"s": 100, "c": 0}
    assert "evidence source failed: router at" in h["windows"][0]["notes"][0]


class GatedClock:
    """The controller's clock and sleep: sleeping moves a fake clock (a 3 s window passes in a few ms), and
    while the gate is closed the controller parks in its next sleep, so the test decides what comes first."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0
        self.gate, self.parked = threading.Event(), threading.Event()

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        if not self.gate.is_set():
            self.parked.set()
            assert self.gate.wait(10)
        self.now += s
        time.sleep(0.001)


class Killed(Exception):
    """The controller's process dies (not an error it retries)."""


class DiesAtWindow(ScriptedEvidence):
    def __init__(self, script: list[tuple[VersionEvidence, VersionEvidence]], dies_at: int) -> None:
        super().__init__(script)
        self.dies_at = dies_at

    def collect(self) -> Evidence:
        if self.windows == self.dies_at:
            raise Killed
        return super().collect()


def test_a_restarted_controller_judges_with_the_held_evidence_of_the_killed_one(tmp_path: Path) -> None:
    # 2 canary requests a window, min_requests 5, max_inconclusive 2: two windows hold, then the controller dies.
    # The next one judges 2 + 2 + 2 = 6 requests and passes; without the journaled evidence it would see 2, past
    # max_inconclusive, and pause for too little traffic.
    sp = spec(steps=[10, 100])
    plane, journal = MemoryPlane(), Journal(tmp_path / "j.sqlite")
    r = journal.create(sp.model_dump(mode="json"), "s", "c")
    script = [(healthy("c", 2), healthy("s", 30))]
    with pytest.raises(Killed):
        Controller(journal, r.id, sp, plane, DiesAtWindow(script, dies_at=2), pace=Pace(tick=0.01)).run()  # type: ignore[arg-type]
    assert [d["action"] for d in journal.history(r.id)["decisions"]] == ["start", "hold", "hold"]
    final = Controller(journal, r.id, sp, plane, ScriptedEvidence(script), pace=Pace(tick=0.01)).run()  # type: ignore[arg-type]
    h = journal.history(r.id)
    assert final.state == "promoted", final.reason
    assert [d["action"] for d in h["decisions"]] == ["start", "hold", "hold", "advance", "promoted"]
    assert h["windows"][-1]["canary"]["requests"] == 6
    assert journal.carry(r.id) is None  # spent by the passing window


def test_pause_abort_from_another_connection(tmp_path: Path) -> None:
    sp = spec(interval=3.0)
    plane = MemoryPlane()
    journal = Journal(tmp_path / "j.sqlite")
    r = journal.create(sp.model_dump(mode="json"), "s", "c")
    clock = GatedClock()
    ctl = Controller(journal, r.id, sp, plane, ScriptedEvidence([(healthy("c", 20), healthy("s", 80))]),  # type: ignore[arg-type]
                     pace=Pace(tick=0.25, sleep=clock.sleep, clock=clock.time))
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(ctl.run()))
    t.start()
    import qlift.rollout.api as api
    from qlift.rollout import dataplane

    assert clock.parked.wait(10)  # inside the first window at 10%
    api.pause(tmp_path / "j.sqlite")
    paused_at = clock.now
    clock.gate.set()
    deadline = time.monotonic() + 10  # unpaused, a healthy canary would be promoted within 2 windows (6 s)
    while clock.now < paused_at + 5 * sp.interval and time.monotonic() < deadline:
        time.sleep(0.01)
    assert clock.now >= paused_at + 5 * sp.interval
    assert plane.applied == [{"s": 90, "c": 10}]  # paused: no window judged, no step taken
    original = dataplane.make_data_plane
    dataplane.make_data_plane = lambda s, router_token: plane  # type: ignore[assignment,return-value,misc]
    try:
        aborted = api.abort(tmp_path / "j.sqlite")
    finally:
        dataplane.make_data_plane = original
    t.join(5)
    assert aborted.state == "aborted" and plane.current == {"s": 100, "c": 0}
    assert getattr(result[0], "state", None) == "aborted"
    actions = [(d["action"], d["manual"]) for d in journal.history(r.id)["decisions"]]
    assert actions == [("start", False), ("pause", True), ("abort", True)]


class SwappedCanaryPlane(MemoryPlane):
    """A plane whose canary starts serving another model after its first window."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def identity(self, version: str) -> str | None:
        if version != "c":
            return "root /models/base"
        self.reads += 1
        return "root /models/ft-v1" if self.reads == 1 else "root /models/ft-v2"


def test_a_canary_whose_model_changes_mid_rollout_is_paused_unjudged(tmp_path: Path) -> None:
    """Its evidence so far is the old model's: the second window is not judged, the rollout pauses and says why."""
    sp = spec(steps=[10, 50, 100], analysis={"min_requests": 5, "intervals_per_step": 2})
    plane = SwappedCanaryPlane()
    journal = Journal(tmp_path / "j.sqlite")
    r = journal.create(sp.model_dump(mode="json"), "s", "c")
    ctl = Controller(journal, r.id, sp, plane, ScriptedEvidence([(healthy("c", 20), healthy("s", 80))]),  # type: ignore[arg-type]
                     pace=Pace(tick=0.01))
    t = threading.Thread(target=ctl.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while journal.get(r.id).state != "paused" and time.monotonic() < deadline:
        time.sleep(0.02)
    got = journal.get(r.id)
    assert got.state == "paused" and "/models/ft-v1 -> root /models/ft-v2" in got.reason, got.reason
    assert plane.applied == [{"s": 90, "c": 10}]  # never advanced on the old model's passing window
    h = journal.history(r.id)
    kinds = [e["kind"] for e in h["events"] if e["kind"].startswith("canary_")]
    assert kinds == ["canary_identity", "canary_changed"]
    assert [w["action"] for w in h["windows"]] == ["pass"]  # the one window judged is the first model's
    import qlift.rollout.api as api
    from qlift.rollout import dataplane

    original = dataplane.make_data_plane
    dataplane.make_data_plane = lambda s, router_token: plane  # type: ignore[assignment,return-value,misc]
    try:
        api.abort(tmp_path / "j.sqlite")
    finally:
        dataplane.make_data_plane = original
    t.join(5)
