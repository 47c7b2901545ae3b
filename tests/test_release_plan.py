"""qlift release around a production router, without a model server: the plan says what promote will do to
the router's traffic (from the router's real weights, else the journal), `release status` shows the rollout's
outcome, reason, journal and each stage's duration, and a serve stage's port."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml
from faults import RouterProcess, TinyBackend

from qlift.release.journal import ReleaseJournal, RunOutcome, StageStatus
from qlift.router.client import RouterClient

REPO = Path(__file__).resolve().parent.parent
TOKEN = "release-plan-token"
EVAL = {"prompts": str(REPO / "examples" / "prompts" / "smoke.jsonl"), "baseline": "base",
        "backend": "transformers", "gates": ["rougeL >= 0"]}


def _release(path: Path, base: Path, stable: str, canary: str, router: str, *, with_eval: bool) -> Path:
    stages = [{"stage": "eval", "options": EVAL}] if with_eval else []
    stages += [
        {"stage": "serve", "name": "stable", "options": {"role": "stable", "url": stable}},
        {"stage": "serve", "name": "canary", "options": {"role": "candidate", "url": canary}},
        {"stage": "router", "options": {"url": router}},
        {"stage": "promote", "options": {"steps": [10, 100], "interval": "20s"}},
    ]
    doc = {"name": "prod", "out": "out", "base": {"path": str(base)}, "stages": stages}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _promote_line(run_cli, f: Path) -> dict:
    r = run_cli("release", "run", f, "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    stage = json.loads(r.stdout)["stages"][-1]
    assert stage["name"] == "promote"
    assert stage["warning"] in r.stderr  # the progress line says it too
    return stage


def test_the_plan_says_what_promote_will_do_to_a_production_routers_traffic(
        run_cli, tmp_path: Path, tiny_qwen2_tied: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ("--public-model", "pub", "--weight", "stable=100", "--weight", "canary=0")
    with TinyBackend("m-stable") as a, TinyBackend("m-canary") as b, \
            RouterProcess("--backend", f"stable={a.url}", "--backend", f"canary={b.url}", *argv,
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        f = _release(tmp_path / "release.yaml", tiny_qwen2_tied, a.url, b.url, router.url, with_eval=False)
        monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)
        fresh = _promote_line(run_cli, f)
        assert fresh["action"] == "run"
        assert fresh["warning"] == f"will run promote: moves live traffic on {router.url} (now canary=0, stable=100)"

        # After a promotion the backend named canary holds 100%: promote would refuse to start there (#54: the
        # plan used to announce that the weights go back to the stable).
        RouterClient(router.url, TOKEN).set_weights({"stable": 0, "canary": 100})
        again = _promote_line(run_cli, f)
        assert again["warning"].startswith(f"promote would refuse to start: a rollout starts from the stable at "
                                           f"100% and {router.url} does not hold it (canary=100, stable=0); the "
                                           "canary was promoted")

    # Without the router's token, the last promote in the journal decides; an eval to run blocks the live
    # stages, and the blocked promote line still warns.
    monkeypatch.delenv("QLIFT_ROUTER_TOKEN")
    f = _release(tmp_path / "release.yaml", tiny_qwen2_tied, "http://127.0.0.1:1", "http://127.0.0.1:1",
                 "http://127.0.0.1:1", with_eval=True)
    with ReleaseJournal(tmp_path / "out" / "release.sqlite") as journal:
        journal.begin("promote", "sha256:" + "0" * 64, "")
        journal.end("promote", "sha256:" + "0" * 64, StageStatus.DONE, result={"state": "promoted"})
    blocked = _promote_line(run_cli, f)
    assert blocked["action"] == "blocked" and blocked["reason"] == "needs eval (made when it runs)"
    assert blocked["warning"].startswith("will re-run promote, which refuses to start unless http://127.0.0.1:1 "
                                         "holds the stable at 100% (the last promote here promoted the canary)")


def test_status_shows_the_rollouts_outcome_reason_journal_and_each_stages_duration(
        run_cli, tmp_path: Path, tiny_qwen2_tied: Path) -> None:
    f = _release(tmp_path / "release.yaml", tiny_qwen2_tied, "http://127.0.0.1:1", "http://127.0.0.1:1",
                 "http://127.0.0.1:1", with_eval=False)
    db = tmp_path / "out" / "release.sqlite"
    rollout = tmp_path / "out" / "rollout-1.sqlite"
    with ReleaseJournal(db) as journal:
        run_id = journal.start_run(f)
        for name in ("stable", "canary", "router", "promote"):
            journal.begin(name, f"sha256:{name}", "")
        journal.end("promote", "sha256:promote", StageStatus.FAILED,
                    result={"state": "rolled_back", "reason": "latency 2.29x > 1.5x", "journal": str(rollout)})
        journal.finish_run(run_id, RunOutcome.FAILED, "stage 'promote': rolled back")
    with sqlite3.connect(db) as conn:  # the promote stage ran 63 s; the others are still journaled running
        conn.execute("UPDATE stages SET started_at='2026-12-03T10:00:00+00:00', "
                     "finished_at='2026-12-03T10:01:03+00:00' WHERE name='promote'")
    r = run_cli("release", "status", f, "--json")
    assert r.exit_code == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["rollout"] == {"state": "rolled_back", "reason": "latency 2.29x > 1.5x", "journal": str(rollout)}
    stages = {s["name"]: s for s in status["stages"]}
    assert stages["promote"]["seconds"] == 63 and stages["stable"]["seconds"] is None
    r = run_cli("release", "status", f)
    lines = r.stdout.splitlines()
    assert "rollout rolled_back: latency 2.29x > 1.5x" in lines
    assert f"rollout journal {rollout} (`qlift promote status --journal {rollout}`)" in lines
    assert f"release journal {db}" in lines
    assert any(line.startswith("promote ") and " 63 s" in line for line in lines), r.stdout

    # A run killed while promote ran: its rollout's journal is named, and the rollout is interrupted.
    with ReleaseJournal(db) as journal:
        run_id = journal.start_run(f)
        journal.begin("promote", "sha256:promote2", "")
    status = json.loads(run_cli("release", "status", f, "--json").stdout)
    assert status["last_run"]["outcome"].startswith("killed")
    assert status["rollout"] == {"state": "interrupted", "reason": "",
                                 "journal": str(tmp_path / "out" / f"rollout-{run_id}.sqlite")}


def test_a_serve_stage_takes_a_port_and_refuses_clashes(run_cli, tmp_path: Path, tiny_qwen2_tied: Path) -> None:
    from qlift.models.ref import ModelRef
    from qlift.release.live import serve_request
    from qlift.release.spec import ServeStageOptions

    _, options = serve_request(ModelRef(base=tiny_qwen2_tied, content_hash="sha256:0"), ServeStageOptions(port=8001))
    assert options.port == 8001 and options.host == "127.0.0.1"
    serve = [{"stage": "serve", "name": "stable", "input": "base", "options": {"role": "stable", "port": 8001}},
             {"stage": "serve", "name": "canary", "options": {"role": "candidate", "port": 8001}},
             {"stage": "router", "options": {}}]
    f = tmp_path / "release.yaml"
    f.write_text(yaml.safe_dump({"base": {"path": str(tiny_qwen2_tied)}, "stages": serve}), encoding="utf-8")
    r = run_cli("release", "run", f, "--dry-run")
    assert r.exit_code == 2 and "stages 'stable' and 'canary' both listen on port 8001" in r.stderr
    serve[1]["options"] = {"role": "candidate", "sets": ["port=8002"]}
    f.write_text(yaml.safe_dump({"base": {"path": str(tiny_qwen2_tied)}, "stages": serve}), encoding="utf-8")
    r = run_cli("release", "run", f, "--dry-run")
    assert r.exit_code == 2 and "field 'options': 'port=8002' is not a recipe key: give the server's port as " \
        "options.port" in r.stderr, r.stderr
    # For a running router, a server the release starts must be where its backend points, and outlive the run.
    serve[1]["options"] = {"role": "candidate", "port": 8002}
    serve[2]["options"] = {"url": "http://127.0.0.1:8000"}
    f.write_text(yaml.safe_dump({"base": {"path": str(tiny_qwen2_tied)}, "stages": serve}), encoding="utf-8")
    r = run_cli("release", "run", f, "--dry-run")
    assert r.exit_code == 2 and f"{f}: stage 'stable' (serve): field 'options': it starts a server for the " \
        "running router http://127.0.0.1:8000, so it needs the port that router's backend names and keep_running: " \
        "true" in r.stderr, r.stderr
    for s in serve[:2]:
        s["options"]["keep_running"] = True
    f.write_text(yaml.safe_dump({"base": {"path": str(tiny_qwen2_tied)}, "stages": serve}), encoding="utf-8")
    assert run_cli("release", "run", f, "--dry-run").exit_code == 0


def test_statuses_are_enums_in_code_and_the_same_words_in_the_journal(tmp_path: Path) -> None:
    """A journal an older qlift wrote (plain words) reads back as the enums, and what this one writes is those
    words, so either reads the other's journal; a stage cannot end `running`."""
    db = tmp_path / "release.sqlite"
    with ReleaseJournal(db) as journal:
        run_id = journal.start_run(tmp_path / "release.yaml")
        journal.begin("merge", "sha256:m", "")
        with pytest.raises(ValueError, match="ends done or failed"):
            journal.end("merge", "sha256:m", StageStatus.RUNNING)
        journal.end("merge", "sha256:m", StageStatus.DONE)
        journal.finish_run(run_id, RunOutcome.FAILED, "stage 'eval': a gate failed")
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO stages (name, key, status, output, started_at) VALUES "
                     "('eval', 'sha256:e', 'failed', '', '2026-12-01T10:00:00+00:00')")
        assert conn.execute("SELECT status FROM stages WHERE name='merge'").fetchone() == ("done",)
        assert conn.execute("SELECT outcome FROM runs").fetchone() == ("failed",)
    with ReleaseJournal(db, readonly=True) as journal:
        row, run = journal.stage("eval", "sha256:e"), journal.last_run()
        assert row is not None and row.status is StageStatus.FAILED and row.result == {}
        assert run is not None and run.outcome is RunOutcome.FAILED


def test_a_serve_stage_serves_the_releases_ref_hashing_only_its_adapters(tiny_qwen2_tied: Path, tiny_lora_tied: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The release's serve stage hands serve the model's ref: the version it records (model.json) is that hash with
    the --lora adapters, and only the adapters are hashed."""
    from qlift.models import ref as refs
    from qlift.release.live import serve_request
    from qlift.release.spec import ServeStageOptions
    from qlift.serve.launch import prepare

    model = refs.ModelRef.of(tiny_qwen2_tied)
    hashed: list[Path] = []
    real = refs.dir_hash
    monkeypatch.setattr(refs, "dir_hash", lambda path, memo=None: hashed.append(Path(path)) or real(path, memo))
    inputs, options = serve_request(model, ServeStageOptions(recipe="cpu", loras={"t": tiny_lora_tied}))
    spec = prepare(inputs.model, options)
    assert hashed == [tiny_lora_tied.resolve()]
    assert spec.model_ref is not None and spec.model_ref.base == model.base
    assert [(a.name, a.path) for a in spec.model_ref.adapters] == [("t", tiny_lora_tied.resolve())]
    assert spec.model_ref.content_hash == refs.ref_hash(tiny_qwen2_tied, spec.model_ref.adapters)
