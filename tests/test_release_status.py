"""`qlift release status` keeps the rollout's typed status (#53): the text is rendered from it, ``--json`` is the
one serializer's output of it in the shape it has always had, and qlift/release compares rollout states and stage
outcomes as enums, never as free strings."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import yaml

from qlift.release.journal import ReleaseJournal, StageStatus
from qlift.release.kinds import StageKind
from qlift.release.rollout_state import LiveServe, ReadRollout
from qlift.release.spec import load_release
from qlift.release.status import release_status, status_lines
from qlift.rollout.journal import Journal
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.states import EventKind, State, StepOutcome
from qlift.rollout.status import RolloutStatus
from qlift.serialize import to_jsonable

REPO = Path(__file__).resolve().parent.parent
DEAD = "http://127.0.0.1:1"  # nothing listens: the servers and the router do not answer
STOP = {"how": "SIGTERM", "state": "progressing", "step": 0, "steps": 3, "weights": {"s": 90, "c": 10},
        "applied": True, "pid": 1}


def _interrupted_release(tmp_path: Path) -> Path:
    """A release whose run was killed mid-promote, its rollout at 10% and its controller stopped by SIGTERM."""
    (tmp_path / "base").mkdir()
    stages = [{"stage": "serve", "name": "stable", "options": {"role": "stable", "url": DEAD}},
              {"stage": "serve", "name": "canary", "options": {"role": "candidate", "url": DEAD}},
              {"stage": "router", "options": {"url": DEAD}},
              {"stage": "promote", "options": {"steps": [10, 50, 100], "interval": "30s"}}]
    f = tmp_path / "release.yaml"
    f.write_text(yaml.safe_dump({"name": "prod", "out": "out", "base": {"path": "base"}, "stages": stages}),
                 encoding="utf-8")
    (tmp_path / "out").mkdir()
    spec = RolloutSpec.model_validate({"stable": "s", "canary": "c", "router": DEAD, "steps": [10, 50, 100]})
    with Journal(tmp_path / "out" / "rollout-1.sqlite") as journal:
        r = journal.create(spec.model_dump(mode="json"), "s", "c")
        journal.change_weights(r.id, {"s": 90, "c": 10}, "step 1", lambda weights: None)
        journal.log_event(r.id, EventKind.CONTROLLER_STOPPED, STOP)
    with ReleaseJournal(tmp_path / "out" / "release.sqlite") as journal:
        run_id = journal.start_run(f)
        for name in ("stable", "canary", "router", "promote"):
            journal.begin(name, f"sha256:{name}", "")
        for name in ("stable", "canary", "router"):
            journal.end(name, f"sha256:{name}", StageStatus.DONE, result={"url": DEAD})
    assert run_id == 1
    return f


def test_the_rollout_read_from_its_journal_stays_typed_and_prints_the_same_json(tmp_path: Path) -> None:
    status = release_status(load_release(_interrupted_release(tmp_path)))
    rollout = status.rollout
    assert isinstance(rollout, ReadRollout) and isinstance(rollout.status, RolloutStatus)
    assert rollout.status.state is State.PROGRESSING and rollout.status.interrupted is not None
    assert [type(s) for s in rollout.servers][:2] == [LiveServe, LiveServe]
    assert [s.kind for s in rollout.servers] == [StageKind.SERVE, StageKind.SERVE, StageKind.ROUTER]

    shown = json.loads(json.dumps(to_jsonable(status)))["rollout"]
    assert list(shown) == ["state", "reason", "journal", "step", "steps", "weights", "controller_running", "final",
                           "interrupted", "interruptions", "router", "servers", "next"]  # never the status itself
    assert shown["state"] == "progressing" and shown["steps"] == 3 and shown["weights"] == {"s": 90, "c": 10}
    assert shown["interrupted"].startswith("interrupted by SIGTERM at ") and shown["interruptions"] == [
        shown["interrupted"]]
    assert shown["router"]["url"] == DEAD and shown["router"]["weights"] is None
    assert [s.get("role") for s in shown["servers"]] == ["stable", "candidate", None]
    assert "role" not in shown["servers"][2]
    assert shown["next"][0].startswith(f"the router {DEAD} does not answer")

    lines = status_lines(status)
    assert "rollout progressing at step 1/3, weights s 90% / c 10%" in lines
    assert any(ln.startswith("  controller interrupted by SIGTERM at ") for ln in lines), lines
    assert f"  canary (serve) {DEAD}: does not answer (a running one the file names by url:)" in lines
    assert any(ln.startswith("promote          interrupted promote") for ln in lines), lines


def test_release_compares_no_free_string_with_a_state_an_outcome_or_a_stage_kind() -> None:
    from qlift.release.journal import RunOutcome

    words = {str(v) for enum in (State, StepOutcome, StageStatus, RunOutcome, StageKind) for v in enum}
    found = []
    for path in sorted((REPO / "qlift" / "release").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                found += [(path.name, node.lineno, c.value) for c in ast.walk(node)
                          if isinstance(c, ast.Constant) and c.value in words]
    assert found == []
