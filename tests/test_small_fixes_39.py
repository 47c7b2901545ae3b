"""Issue 39's smaller holes, each with a test that failed before: a release's promote on a router that serves
users needs --yes, promote's cache key holds the router's, --fp8 --group-size is refused, the control commands
on a missing journal exit 4 creating nothing, journals carry a schema version, the rendered pods drain as `qlift
serve` does, one exit code for an output that cannot be written, and the log readers follow a rotated file."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
import yaml
from faults import RouterProcess, TinyBackend

from qlift.router.client import RouterClient

REPO = Path(__file__).resolve().parent.parent
TOKEN = "small-fixes-39-token"


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def _release(path: Path, base: Path, stable: str, canary: str, router: dict, promote: dict | None = None) -> Path:
    stages = [
        {"stage": "serve", "name": "stable", "options": {"role": "stable", "url": stable}},
        {"stage": "serve", "name": "canary", "options": {"role": "candidate", "url": canary}},
        {"stage": "router", "options": router},
        {"stage": "promote", "options": promote or {"steps": [100], "interval": "20s"}},
    ]
    doc = {"name": "prod", "out": "out", "base": {"path": str(base)}, "stages": stages}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


# -- a release that would move a production router's traffic ----------------------------------------------------


def test_release_run_refuses_to_move_a_serving_routers_traffic_without_yes(
        run_cli, tmp_path: Path, tiny_qwen2_tied: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qlift.release import load_release, run_release

    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)
    argv = ("--public-model", "pub", "--weight", "stable=100", "--weight", "canary=0")
    with TinyBackend("m-stable") as a, TinyBackend("m-canary") as b, \
            RouterProcess("--backend", f"stable={a.url}", "--backend", f"canary={b.url}", *argv,
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        promote = {"steps": [100], "interval": "1s", "analysis": {"min_requests": 2, "on_insufficient": "rollback",
                                                                  "max_inconclusive": 20}}
        f = _release(tmp_path / "release.yaml", tiny_qwen2_tied, a.url, b.url,
                     {"url": router.url, "public_model": "pub"}, promote)
        doc = yaml.safe_load(f.read_text())
        doc["stages"][-1]["load"] = {"prompts": str(REPO / "examples" / "prompts" / "smoke.jsonl"),
                                     "concurrency": 2, "max_tokens": 4}
        f.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        client = RouterClient(router.url, TOKEN)

        r = run_cli("release", "run", f, "--json")
        assert r.exit_code == 2, r.stderr
        line = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
        assert line == [f"error: stage 'promote' would move the live traffic of {router.url} (a router that serves "
                        "users) and --yes was not given. Check the plan with --dry-run, then pass --yes."]
        assert json.loads(r.stdout)["error"] == line[0].removeprefix("error: ")
        assert client.state().weights == {"stable": 100, "canary": 0}
        assert not list((tmp_path / "out").glob("rollout-*.sqlite"))  # no rollout began

        # Asked and declined (a terminal's answer): nothing moves either.
        with pytest.raises(Exception, match="not confirmed: nothing moved") as declined:
            run_release(load_release(f), echo=lambda line: None, confirm=lambda question: False)
        assert type(declined.value).__name__ == "QliftError"
        assert client.state().weights == {"stable": 100, "canary": 0}

        r = run_cli("release", "run", f, "--yes", "--json")
        assert r.exit_code == 0, r.stderr
        stages = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
        assert stages["promote"]["result"]["state"] == "promoted"
        assert client.state().weights == {"stable": 0, "canary": 100}


def test_changing_the_routers_options_runs_promote_again(run_cli, tmp_path: Path, tiny_qwen2_tied: Path) -> None:
    from qlift.release.journal import ReleaseJournal, StageStatus

    down = "http://127.0.0.1:1"
    f = _release(tmp_path / "release.yaml", tiny_qwen2_tied, down, down, {"public_model": "a"})

    def promote_line() -> dict:
        r = run_cli("release", "run", f, "--dry-run", "--json")
        assert r.exit_code == 0, r.stderr
        return json.loads(r.stdout)["stages"][-1]

    first = promote_line()
    with ReleaseJournal(tmp_path / "out" / "release.sqlite") as journal:
        journal.begin("promote", first["key"], "")
        journal.end("promote", first["key"], StageStatus.DONE, result={"state": "promoted"})
    assert promote_line()["action"] == "skip"
    for router in ({"public_model": "b"}, {"public_model": "a", "timeouts": {"idle_s": 9}}):
        _release(f, tiny_qwen2_tied, down, down, router)
        again = promote_line()
        assert again["action"] == "run" and again["key"] != first["key"], router


# -- qlift quantize, promote control commands ------------------------------------------------------------------


def test_quantize_fp8_with_a_group_size_is_refused_in_one_line(run_cli, tmp_path: Path,
                                                               tiny_qwen2_tied: Path) -> None:
    out = tmp_path / "q"
    r = run_cli("quantize", tiny_qwen2_tied, "--fp8", "--group-size", "64", "-o", out)
    assert r.exit_code == 2 and "--group-size apply to --awq only" in _one_line(r.stderr)
    assert not out.exists()


@pytest.mark.parametrize("command", ["pause", "resume", "abort"])
def test_a_control_command_on_a_missing_journal_exits_4_and_creates_nothing(run_cli, tmp_path: Path,
                                                                           command: str) -> None:
    journal = tmp_path / "sub" / "rollout.sqlite"
    r = run_cli("promote", command, "--journal", journal)
    assert r.exit_code == 4 and _one_line(r.stderr).startswith(f"error: no rollout journal at {journal}.")
    assert not journal.parent.exists()
    home = Path(os.environ["QLIFT_HOME"])
    before = sorted(home.rglob("*"))
    r = run_cli("promote", command)  # the default journal under QLIFT_HOME
    assert r.exit_code == 4 and "no rollout journal at" in _one_line(r.stderr)
    assert sorted(home.rglob("*")) == before


# -- journals' schema version -----------------------------------------------------------------------------------


def test_journals_carry_a_schema_version_and_a_newer_one_is_refused(run_cli, tmp_path: Path) -> None:
    from qlift.release.journal import ReleaseJournal
    from qlift.rollout.journal import Journal

    rollout = tmp_path / "rollout.sqlite"
    with Journal(rollout) as journal:
        journal.create({"steps": [100]}, "stable", "canary")
    with sqlite3.connect(rollout) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
        db.execute("PRAGMA user_version = 99")
    for argv in (("status",), ("pause",), ("abort",)):
        r = run_cli("promote", *argv, "--journal", rollout)
        line = _one_line(r.stderr)
        assert r.exit_code == 6 and "schema version 99" in line and "Upgrade qlift" in line, (argv, line)

    release = tmp_path / "out" / "release.sqlite"
    with ReleaseJournal(release):
        pass
    with sqlite3.connect(release) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
        db.execute("PRAGMA user_version = 7")
    f = tmp_path / "release.yaml"
    f.write_text(yaml.safe_dump({"name": "r", "out": "out", "base": {"path": str(tmp_path)},
                                 "stages": [{"stage": "quantize", "options": {"method": "fp8"}}]}), encoding="utf-8")
    for argv in (("status", f), ("run", f)):
        r = run_cli("release", *argv)
        line = _one_line(r.stderr)
        assert r.exit_code == 6 and "schema version 7" in line and "Upgrade qlift" in line, (argv, line)


# -- the rendered pods drain ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sets", "drain"), [((), 30), (("shutdown_timeout=120",), 120)])
@pytest.mark.parametrize("rollout", ["promote", "argo"])
def test_rendered_pods_drain_with_vllms_shutdown_timeout_inside_the_grace_period(
        tiny_qwen2_tied: Path, sets: tuple[str, ...], drain: int, rollout: str) -> None:
    from qlift.deploy import DeployOptions, render_k8s
    from qlift.serve.options import ServeOptions

    assert ServeOptions().drain_s == 30  # the same default `qlift serve --drain` gives vLLM
    objs = render_k8s(DeployOptions(model=tiny_qwen2_tied, recipe="cpu", sets=sets, rollout=rollout)).objects
    pods = [o["spec"]["template"]["spec"] for o in objs.values() if o.get("kind") in ("Deployment", "Rollout")]
    assert pods
    for pod in pods:
        args = pod["containers"][0]["args"]
        assert args[args.index("--shutdown-timeout") + 1] == str(drain)
        assert pod["terminationGracePeriodSeconds"] == drain + 30


# -- one exit code for an output that cannot be written ------------------------------------------------------


@pytest.mark.parametrize("out", ["/proc/x", "/dev/null/x"])
def test_an_output_that_cannot_be_written_is_exit_2_for_every_command(run_cli, tmp_path: Path, out: str,
                                                                      tiny_qwen2_tied: Path,
                                                                      tiny_lora_tied: Path) -> None:
    rows = tmp_path / "in.jsonl"
    rows.write_text('{"id": "a", "prompt": "x"}\n', encoding="utf-8")
    release = tmp_path / "release.yaml"
    release.write_text(yaml.safe_dump({"name": "r", "base": {"path": str(tiny_qwen2_tied)},
                                       "stages": [{"stage": "merge"}], "adapters": [
                                           {"name": "l", "path": str(tiny_lora_tied)}]}), encoding="utf-8")
    commands = [
        ("merge", tiny_qwen2_tied, tiny_lora_tied, "-o", out),
        ("quantize", tiny_qwen2_tied, "--fp8", "-o", out),
        ("deploy", "k8s", tiny_qwen2_tied, "--recipe", "cpu", "-o", out),
        ("batch", tiny_qwen2_tied, rows, "-o", f"{out}/out.jsonl"),
        ("release", "run", release, "--out", out),
    ]
    for argv in commands:
        r = run_cli(*argv)
        line = _one_line(r.stderr)
        assert r.exit_code == 2 and ("/proc" in line or "/dev/null" in line), (argv, r.exit_code, line)


# -- the appended-lines readers follow a rotated file -------------------------------------------------------------


def _access_line(addr: str) -> str:
    return json.dumps({"status": 200, "upstream_addr": addr, "upstream_status": "200",
                       "upstream_response_time": "0.010", "upstream_header_time": "0.005", "request_time": "0.010",
                       "time": 1.0}) + "\n"


def test_nginx_access_log_evidence_follows_a_rotated_log(tmp_path: Path) -> None:
    from qlift.rollout.nginx import AccessLogSource

    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "access.jsonl"
    log.write_text(_access_line("127.0.0.1:9001") * 5, encoding="utf-8")
    source = AccessLogSource(tmp_path, {"stable": "http://127.0.0.1:9001", "canary": "http://127.0.0.1:9002"})
    source.begin()  # what was there before the window is not its evidence
    with log.open("a", encoding="utf-8") as fh:
        fh.write(_access_line("127.0.0.1:9002") * 3)
    assert source.collect()["canary"].requests == 3
    log.rename(logs / "access.jsonl.1")  # logrotate, then nginx -s reopen: a new, shorter file
    log.write_text(_access_line("127.0.0.1:9002") * 2, encoding="utf-8")
    got = source.collect()
    assert (got["canary"].requests, got["stable"].requests) == (2, 0)


def test_batch_progress_counts_rows_of_a_rewritten_output(tmp_path: Path) -> None:
    from qlift.perf.batch import _Progress

    out = tmp_path / "out.jsonl"
    row = json.dumps({"id": "a", "usage": {"completion_tokens": 5}}) + "\n"
    out.write_text(row * 4, encoding="utf-8")
    watch = _Progress(out, 10)
    try:
        watch()
        assert watch.rows == 0  # rows kept from before are not this run's
        out.write_text(row * 2, encoding="utf-8")  # rewritten shorter (kept rows compacted)
        watch()
        assert (watch.rows, watch.tokens) == (2, 10)
    finally:
        watch.close()
