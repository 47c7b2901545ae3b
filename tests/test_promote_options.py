"""Issue 54, items 2 and 4: a rollout takes the options it is given, and its hints are true.

2. `start` on a rollout in progress with other options applies those a rollout can take mid-way (journaled in
   its spec with one decision naming each change; the running controller judges its next window with them) and
   refuses, naming each, those it cannot; every pause line's command names the journal;
4. a canary back in rotation is no longer the cause named; a refused `start` leaves no journal; the
   concurrent-rollout refusal names the other journal and never offers --force; `status` of an old rollout
   claims no controller, and a baked one suggests `finish`, not `resume`.

Real `qlift router` processes in front of small HTTP backends (tests/faults.py), or the real controller on a
fake clock (tests/rollout_journals.py).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from faults import BackgroundLoad, TinyBackend, until
from rollout_journals import run_rollout, spec, version
from test_promote_preflight import TOKEN, one_error_line, router, start_args, weights

from qlift.errors import QliftError
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.journal import Journal
from qlift.rollout.states import State
from qlift.rollout.traffic import TrafficCounts, explain


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)


def fast_spec_rollout(path: Path, sp: Any, *, shadow_counts: list[int] | None = None) -> str:
    """A rollout on the fake clock whose every split window passes (a shadow phase: ``shadow_counts`` pairs)."""
    fast = version("s", 40, token_s=0.050, ttft_s=0.100)
    return run_rollout(path, sp, [(version("c", 30, token_s=0.050, ttft_s=0.100), fast)],
                       shadow_counts=shadow_counts)


class _Paused(Exception):
    pass


def paused_rollout(path: Path, sp: Any, shadow_counts: list[int]) -> str:
    """A rollout on the fake clock up to its first pause (the controller stopped there); its reason."""
    from rollout_journals import ClockedEvidence, ClockedShadow, fake_time
    from test_rollout_journal import MemoryPlane
    from test_rollout_state import FakeClock

    from qlift.rollout.controller import Controller, Pace

    clock = FakeClock()
    with fake_time(clock), Journal(path) as journal:
        r = journal.create(sp.model_dump(mode="json"), sp.stable, sp.canary, state=State.SHADOWING)

        def sleep(s: float) -> None:
            if journal.get(r.id).state == "paused":
                raise _Paused
            clock.sleep(s)

        ctl = Controller(journal, r.id, sp, MemoryPlane(), ClockedEvidence(clock, []),  # type: ignore[arg-type]
                         pace=Pace(tick=0.5, sleep=sleep, clock=clock.time),
                         shadow_source=ClockedShadow(clock, shadow_counts))  # type: ignore[arg-type]
        with pytest.raises(_Paused):
            ctl.run()
        return journal.get(r.id).reason


def _status(journal: Path) -> dict[str, Any]:
    from qlift.rollout.api import status

    return status(journal)


# -- 2. options are never dropped ------------------------------------------------------------------------------


def test_start_again_applies_the_options_a_rollout_can_take_and_refuses_the_rest(run_cli: Any,
                                                                                  tmp_path: Path) -> None:
    from qlift.rollout import build_spec
    from qlift.rollout.api import start

    journal = tmp_path / "j.sqlite"
    with TinyBackend("m-stable", tokens=4, chunk_delay_s=0.005) as s, \
            TinyBackend("m-canary", tokens=4, chunk_delay_s=0.005) as c, router(tmp_path, s.url, c.url) as r:
        base = {"router": r.url, "stable": "stable", "canary": "canary", "steps": "50,100", "interval": "1s"}
        first = build_spec(base, {"analysis.min_requests": 10, "analysis.max_inconclusive": 0})  # no traffic yet
        ended: list[Any] = []
        controller = threading.Thread(target=lambda: ended.append(start(first, journal, allow_small_windows=True)),
                                      daemon=True)  # min_requests 100000 pauses on purpose: past the sizing check
        controller.start()
        def is_paused() -> dict[str, Any] | None:
            try:
                st = _status(journal)
            except QliftError:  # not created yet
                return None
            return st if st["state"] == "paused" else None

        paused = until(is_paused, 20, "the too-little-traffic pause")
        # the pause's command acts on this journal as printed
        assert f"then `qlift promote resume --journal {journal}`" in paused["reason"], paused["reason"]

        # options it cannot take: refused, one line naming each, nothing written
        refused = run_cli(*start_args(r.url, journal, "--steps", "60,100", "--canary-model", tmp_path))
        assert refused.exit_code == 2, refused.stderr
        line = one_error_line(refused.stderr)
        assert "cannot change mid-rollout" in line and "--steps 50,100 -> 60,100 (step(s) 50 already started)" \
            in line, line
        assert f"--canary-model none -> {tmp_path} (the eval gate ran at start)" in line, line
        assert f"`qlift promote abort --journal {journal}`" in line, line
        assert _status(journal)["state"] == "paused"

        # options it can take: applied to the running controller, which resumes with them and promotes
        with BackgroundLoad(r.url, "pub", concurrency=2, max_tokens=4, timeout_s=60):
            applied = run_cli(*start_args(r.url, journal, "--min-requests", "3", "--max-inconclusive", "2",
                                          "--json"))
            assert applied.exit_code == 0, applied.stderr[-2000:]
            controller.join(30)
        assert not controller.is_alive() and ended and ended[0].state == "promoted", ended
        assert weights(r.url) == {"stable": 0, "canary": 100}
    st = _status(journal)
    changed = [d for d in st["decisions"] if d["reason"].startswith("options changed")]
    assert [d["reason"] for d in changed] == [
        "options changed: --min-requests 10 -> 3, --max-inconclusive 0 -> 2; resumed"], st["decisions"]
    assert changed[0]["manual"] and changed[0]["action"] == "options"
    with Journal(journal, readonly=True) as j:
        kept = j.get(1).spec
    assert kept["analysis"]["min_requests"] == 3 and kept["analysis"]["max_inconclusive"] == 2
    assert kept["steps"] == [50, 100] and kept["interval"] == 1.0


def test_a_shadow_pause_resumed_by_start_with_a_larger_share_and_more_holds(tmp_path: Path) -> None:
    """The shadow pause's own line: the `start` it prints (with this journal) applies a larger share; the
    rollout goes on with it, judged with the new spec by a new controller (the resume path)."""
    from qlift.rollout.api import _paused_from
    from qlift.rollout.options_change import apply_options

    path = tmp_path / "shadow.sqlite"
    sp = spec(shadow={"percent": 20, "windows": 1, "min_pairs": 8})
    paused_rollout(path, sp, [0])
    with Journal(path) as journal:
        r = journal.get(1)
        assert r.state == "paused"
        assert f"`qlift promote start --router http://127.0.0.1:1 --stable s --canary c --shadow 40% --journal " \
               f"{path}` applies it and resumes" in r.reason, r.reason
        given = spec(shadow={"percent": "40%"}, analysis={"max_inconclusive": 20})
        after = apply_options(journal, r, given, resume_to=_paused_from(journal, r))
        assert after.state == "shadowing" and after.holds == 0
        assert after.spec["shadow"]["percent"] == 40 and after.spec["shadow"]["min_pairs"] == 8
        assert after.spec["analysis"]["max_inconclusive"] == 20 and after.spec["analysis"]["min_requests"] == 5
        reasons = [d["reason"] for d in journal.history(1)["decisions"]]
        assert reasons[-1] == "options changed: --max-inconclusive 2 -> 20, --shadow 20% -> 40%; resumed", reasons
        # the same options again: nothing to change, nothing journaled
        assert apply_options(journal, after, given) is after


def test_a_shadow_phase_is_not_added_to_a_rollout_in_progress(tmp_path: Path) -> None:
    from qlift.rollout.options_change import apply_options

    path = tmp_path / "j.sqlite"
    assert fast_spec_rollout(path, spec(steps=[50, 100], bake=1)) == "baked"
    with Journal(path) as journal:
        r = journal.get(1)
        with pytest.raises(QliftError, match=r"--shadow none -> 50% \(a shadow phase runs before the first step: "
                                             r"this rollout has none\); --bake 1 -> 2 \(the bake already passed\)"):
            apply_options(journal, r, spec(steps=[50, 100], bake=2, shadow={"percent": 50}))
        assert journal.get(1).spec == r.spec  # nothing written
        assert not [d for d in journal.history(1)["decisions"] if d["reason"].startswith("options changed")]


# -- 4. hints that are true ------------------------------------------------------------------------------------


def test_a_canary_back_in_rotation_is_not_named_down() -> None:
    """Held windows carry the router's earlier DOWN (merged evidence); once the canary is back, the cause is
    what stands now, never `bring its server back`."""
    down = VersionEvidence("c", requests=0, errors=0, down="its /health check fails",
                           down_seen="its /health check fails")
    held = Evidence(VersionEvidence("s", requests=40, errors=0), down, 0.0, 30.0, "router")
    back = Evidence(VersionEvidence("s", requests=40, errors=0), VersionEvidence("c", requests=2, errors=0),
                    30.0, 60.0, "router")
    merged = held.merged(back)
    text = explain(TrafficCounts.of(merged, share=0.1, window_s=60, min_requests=20)).text
    assert "bring its server back" not in text and not text.startswith("canary DOWN"), text
    assert "has put it back" in text, text
    still = explain(TrafficCounts.of(held, share=0.1, window_s=30, min_requests=20)).text
    assert still.startswith("canary DOWN: its /health check fails") and "bring its server back" in still


def test_a_refused_start_leaves_no_journal_and_resume_of_nothing_is_not_found(run_cli: Any, tmp_path: Path) -> None:
    journal = tmp_path / "new" / "j.sqlite"
    refused = run_cli(*start_args("http://127.0.0.1:1", journal))
    assert refused.exit_code == 8, refused.stderr  # the router does not answer
    assert not journal.parent.exists(), list(journal.parent.iterdir())
    empty = tmp_path / "empty.sqlite"
    Journal(empty).close()
    res = run_cli("promote", "resume", "--journal", empty)
    assert res.exit_code == 4, res.stderr  # docs/index.md: 4, not found


def test_another_rollout_on_the_router_is_named_never_forced(run_cli: Any, tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    Journal(other).close()
    with TinyBackend("m-stable") as s, TinyBackend("m-canary") as c, \
            router(tmp_path, s.url, c.url, stable=50, canary=50) as r:
        unknown = one_error_line(run_cli(*start_args(r.url, tmp_path / "mine.sqlite")).stderr)
        with Journal(other) as j, j.controller_lock() as held:
            assert held
            known = one_error_line(run_cli(*start_args(r.url, tmp_path / "mine.sqlite")).stderr)
    for line in (unknown, known):
        assert "ITS_JOURNAL" not in line and "--force" not in line, line
    assert f"`qlift promote abort --journal {other}`" in known, known
    assert "--journal FILE of the `qlift promote start`" in unknown, unknown
    assert not (tmp_path / "mine.sqlite").exists()


def test_status_of_an_old_rollout_claims_no_controller_and_a_baked_one_suggests_finish(tmp_path: Path) -> None:
    from qlift.rollout.status import rollout_status
    from qlift.rollout.view import status_lines

    path = tmp_path / "j.sqlite"
    assert fast_spec_rollout(path, spec(steps=[50, 100], bake=1)) == "baked"
    lines = "\n".join(status_lines(rollout_status(path)))
    assert "promote resume" not in lines and f"`qlift promote finish --journal {path}`" in lines, lines
    from qlift.rollout.bake import finish

    assert finish(path).state == "finished"
    assert fast_spec_rollout(path, spec(steps=[50, 100])) == "promoted"
    with Journal(path) as journal, journal.controller_lock():
        old, latest = rollout_status(path, 1), rollout_status(path, 2)
    assert old.controller.pid is None and not old.controller.alive, old.controller
    assert latest.controller.alive
    assert json.dumps(old.controller_pid) == "null"
