"""qlift release on tiny models: the file's validation, the plan, caching by content, gates, resume
after SIGKILL (real merges and transformers evals; no vLLM)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "examples" / "prompts" / "smoke.jsonl"
EVAL = {"prompts": str(SMOKE), "baseline": "base", "backend": "transformers", "max_tokens": 4, "resamples": 100,
        "metrics": "rougeL,length", "gates": ["rougeL >= 0"]}


def _write(path: Path, base: Path, adapter: Path, stages: list[dict], out: str = "out") -> Path:
    doc = {"name": "tiny", "out": out, "base": {"path": str(base)},
           "adapters": [{"name": "lora", "path": str(adapter)}], "stages": stages}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _stages(gates: list[str] | None = None) -> list[dict]:
    return [{"stage": "merge", "options": {"verify": False}},
            {"stage": "eval", "options": {**EVAL, "gates": gates or EVAL["gates"]}}]


def _count_dir_hashes(monkeypatch: pytest.MonkeyPatch) -> dict[Path, int]:
    """How many times each directory is hashed (``qlift.models.ref.dir_hash``, behind every ``ModelRef.of``)."""
    from qlift.models import ref

    counts: dict[Path, int] = {}
    real = ref.dir_hash

    def counting(path: Path, memo: Path | None = None) -> str:
        counts[Path(path).resolve()] = counts.get(Path(path).resolve(), 0) + 1
        return real(path, memo)

    monkeypatch.setattr(ref, "dir_hash", counting)
    return counts


def _actions(stdout: str) -> dict[str, str]:
    return {s["name"]: s["action"] for s in json.loads(stdout)["stages"]}


@pytest.fixture(autouse=True)
def _eval_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_EVAL_CACHE", str(tmp_path / "eval-cache"))


def _qlift(*args: object, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qlift", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())


BAD = [
    ({"stage": "merge", "options": {"dtype": "int3"}}, "merge", "options.dtype", "not one of"),
    ({"stage": "merge", "options": {"tolerence": 0.1}}, "merge", "options.tolerence", "unknown field"),
    ({"stage": "quantize", "options": {"method": "awq", "num_samples": 0}}, "quantize", "options.num_samples",
     "greater than or equal to 1"),
    ({"stage": "quantize", "options": {"method": "gptq"}}, "quantize", "options.method", "gptq"),
    ({"stage": "eval", "options": {"prompts": "p.jsonl", "max_tokens": "many"}}, "eval", "options.max_tokens",
     "integer"),
    ({"stage": "eval", "options": {"prompts": "p.jsonl", "resamples": 5}}, "eval", "options.resamples",
     "greater than or equal to 100"),  # its flag is --bootstrap; the file's field is named
    ({"stage": "eval", "options": {"prompts": "p.jsonl", "report_dir": "x"}}, "eval", "options.report_dir",
     "set by the release"),
    ({"stage": "serve", "name": "cand", "options": {"core": -1}}, "cand", "options.core", "greater than"),
    ({"stage": "router", "options": {"limits": {"requests_per_s": 0}}}, "router", "options.limits.requests_per_s",
     "greater than"),
    ({"stage": "router", "options": {"backends": []}}, "router", "options.backends", "set by the release"),
    ({"stage": "router", "options": {"state_file": "w.json"}}, "router", "options.state_file", "set by the release"),
    ({"stage": "promote", "options": {"analysis": {"min_requests": 0}}}, "promote", "options.analysis.min_requests",
     "greater than"),
    ({"stage": "promote", "options": {"steps": [10, 100], "colour": 1}}, "promote", "options.colour", "xtra"),
    ({"stage": "promote", "options": {"canary_hash": "sha256:0"}}, "promote", "options.canary_hash",
     "set by the release"),
]


@pytest.mark.parametrize(("stage", "name", "field", "says"), BAD)
def test_bad_stage_field_is_one_line_naming_file_stage_field(run_cli, tmp_path: Path, stage: dict, name: str,
                                                           field: str, says: str) -> None:
    f = _write(tmp_path / "release.yaml", tmp_path, tmp_path, [stage])
    r = run_cli("release", "run", f, "--dry-run")
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {f}: stage '{name}' ({stage['stage']}): field '{field}': "), lines[0]
    assert says in lines[0]


def test_bad_top_level_field_and_flow(run_cli, tmp_path: Path) -> None:
    f = tmp_path / "release.yaml"
    f.write_text("base: {builtin: smollm2, path: x}\nstages: [{stage: merge}]\n")
    r = run_cli("release", "run", f)
    assert r.exit_code == 2 and "field 'base'" in r.stderr and "exactly one of" in r.stderr
    _write(f, tmp_path, tmp_path, [{"stage": "promote"}])
    r = run_cli("release", "run", f)
    assert r.exit_code == 2 and "needs a router stage" in r.stderr


@pytest.mark.parametrize("out", ["/proc/x", "/dev/null/x"])
def test_an_out_that_cannot_be_a_directory_is_one_line_exit_2(run_cli, tmp_path: Path, out: str) -> None:
    """Before, mkdir's FileNotFoundError / NotADirectoryError ended the run in exit 70 "internal error"; an output
    that cannot be written is exit 2 for every command (docs/index.md)."""
    f = _write(tmp_path / "release.yaml", tmp_path, tmp_path, _stages(), out=out)
    for argv, named in ((), f"{f}: field 'out'"), (("--out", out), "--out"):
        r = run_cli("release", "run", f, *argv)
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1, r.stderr
        assert lines[0].startswith(f"error: {named}: cannot create the directory {out} ("), lines[0]


DUPLICATE = [
    ("name: a\nout: o\nbase: {builtin: smollm2}\nname: b\nstages: [{stage: merge}]\n",
     "key 'name' appears twice (lines 1 and 4)"),
    ("name: a\nbase: {builtin: smollm2}\nadapters: [{name: x, path: x}]\nstages:\n  - stage: merge\n"
     "    options: {verify: true}\n    options: {verify: false}\n", "key 'options' appears twice (lines 6 and 7)"),
]


@pytest.mark.parametrize(("text", "says"), DUPLICATE, ids=["top-level", "in-a-stage"])
def test_a_key_given_twice_is_refused_naming_both_lines(run_cli, tmp_path: Path, text: str, says: str) -> None:
    """Before, the last one won silently."""
    f = tmp_path / "release.yaml"
    f.write_text(text)
    r = run_cli("release", "run", f, "--dry-run")
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [f"error: {f}: {says}. Remove one of them."]


HOSTILE = [
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nname: x\nbase: {builtin: smollm2}\nstages: [*c]\n", "stages.0"),
    ("name: !!python/object/apply:os.system [echo hi]\nbase: {builtin: smollm2}\nstages: [{stage: merge}]\n",
     "could not determine a constructor"),
    ("name: x\nbase: &b {builtin: smollm2, again: *b}\nstages: [{stage: merge}]\n", "base.again"),
    ("name: x\nbase: {builtin: smollm2}\nm: &m {stage: merge}\nstages: [{<<: *m, name: m2}]\n", "field 'm'"),
]


@pytest.mark.parametrize(("text", "says"), HOSTILE, ids=["anchor-bomb", "python-tag", "cycle", "merge-key"])
def test_hostile_yaml_stays_refused_in_one_line(run_cli, tmp_path: Path, text: str, says: str) -> None:
    """The duplicate-key loader keeps the SafeLoader's refusals: an anchor bomb, a python tag, a cycle; a merge key
    (<<) may be overridden by a key of the mapping itself."""
    f = tmp_path / "release.yaml"
    f.write_text(text)
    r = run_cli("release", "run", f, "--dry-run")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and says in lines[0], r.stderr


def test_schema_spells_out_every_stage(run_cli) -> None:
    r = run_cli("release", "schema")
    assert r.exit_code == 0
    schema = json.loads(r.stdout)
    variants = {v["properties"]["stage"]["const"]: v["properties"]["options"]
                for v in schema["properties"]["stages"]["items"]["oneOf"]}
    assert set(variants) == {"merge", "quantize", "eval", "serve", "router", "promote"}
    assert variants["merge"]["properties"]["dtype"]["description"].startswith("Dtype of the merged weights")
    assert "force" not in variants["merge"]["properties"] and "report_dir" not in variants["eval"]["properties"]
    assert variants["quantize"]["required"] == ["method"]
    assert "stable" not in variants["promote"]["properties"] and "steps" in variants["promote"]["properties"]
    assert "AnalysisSpec" in schema["$defs"]  # promote's nested refs resolve
    assert "limits" in variants["router"]["properties"] and "backends" not in variants["router"]["properties"]


def test_plan_cache_gate_change_and_failing_gate(run_cli, tmp_path: Path, tiny_qwen2_tied: Path,
                                                 tiny_lora_tied: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _write(tmp_path / "release.yaml", tiny_qwen2_tied, tiny_lora_tied, _stages())
    r = run_cli("release", "run", f, "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)["stages"]
    assert [(s["name"], s["action"]) for s in plan] == [("base", "skip"), ("merge", "run"), ("eval", "blocked")]
    assert plan[1]["reason"] == "never run" and plan[2]["reason"].startswith("needs merge")
    assert not (tmp_path / "out").exists()  # a plan writes nothing

    hashed = _count_dir_hashes(monkeypatch)
    r = run_cli("release", "run", f, "--json")
    assert r.exit_code == 0, r.stderr
    first = json.loads(r.stdout)["stages"]
    assert [s["action"] for s in first] == ["skipped", "ran", "ran"]
    assert len(r.stderr.strip().splitlines()) >= 3 and "[2/3] merge (merge): ran" in r.stderr
    merged = Path(first[1]["output"])
    report = json.loads((Path(first[2]["output"]) / "report.json").read_text())
    assert report["candidate"]["content_hash"] == first[1]["content_hash"]  # the eval gate's hash is the ModelRef's
    # Identity is computed once and carried: the base and the adapter hashed once each, the merge's output never
    # (its result carries its ref), and eval hashes neither its candidate nor its baseline again. Eval's report
    # is not a model: it is never hashed as one (its journaled hash is its files', as its qlift.json records them).
    assert hashed == {tiny_qwen2_tied.resolve(): 1, tiny_lora_tied.resolve(): 1}, hashed
    assert report["baseline"]["content_hash"] == first[0]["content_hash"]
    from qlift import lineage

    report_dir = Path(first[2]["output"])
    recorded = lineage.read_manifest(report_dir)
    assert recorded is not None
    assert first[2]["content_hash"] == lineage.content_hash(
        {rel: lineage.FileRecord(r["size"], r["sha256"]) for rel, r in recorded["outputs"].items()})

    # A second run, in a fresh process: every stage skipped, each with its reason, well under 15 s.
    t0 = time.monotonic()
    p = _qlift("release", "run", f, "--json")
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    assert _actions(p.stdout) == {"base": "skipped", "merge": "skipped", "eval": "skipped"}
    assert "merge (merge): skipped" in p.stderr and "cached" in p.stderr
    assert took < 15, took

    plan = json.loads(run_cli("release", "run", f, "--dry-run", "--json").stdout)["stages"]
    assert [s["action"] for s in plan] == ["skip", "skip", "skip"]
    assert plan[1]["reason"] == f"cached {plan[1]['key'][7:19]}"
    # --out: the same file's release in another place starts from nothing there.
    other = json.loads(run_cli("release", "run", f, "--dry-run", "--out", tmp_path / "elsewhere", "--json").stdout)
    assert other["out"] == str((tmp_path / "elsewhere").resolve())
    assert [s["action"] for s in other["stages"]] == ["skip", "run", "blocked"]

    # Only a gate changes: eval runs again, merge is reused (same output dir, untouched).
    mtime = (merged / "qlift.json").stat().st_mtime_ns
    _write(f, tiny_qwen2_tied, tiny_lora_tied, _stages(["rougeL >= 0", "length >= 0"]))
    plan = json.loads(run_cli("release", "run", f, "--dry-run", "--json").stdout)["stages"]
    assert [s["action"] for s in plan] == ["skip", "skip", "run"]
    assert plan[2]["reason"].startswith("inputs or options changed")
    r = run_cli("release", "run", f, "--json")
    assert r.exit_code == 0, r.stderr
    assert _actions(r.stdout) == {"base": "skipped", "merge": "skipped", "eval": "ran"}
    assert (merged / "qlift.json").stat().st_mtime_ns == mtime

    # A gate that fails: exit 10, the failing gate and the report named; the journal says failed.
    _write(f, tiny_qwen2_tied, tiny_lora_tied, _stages(["rougeL >= baseline + 5"]))
    r = run_cli("release", "run", f, "--json")
    assert r.exit_code == 10
    failed = json.loads(r.stdout)
    assert [s["action"] for s in failed["stages"]] == ["skipped", "skipped", "failed"]
    assert failed["error"].startswith("stage 'eval': 1 of 1 gate(s) failed")
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: stage 'eval': 1 of 1 gate(s) failed: rougeL >= baseline + 5") and "report.md" in last
    assert f"`qlift release run {f}` again reuses the stages before eval" in last  # the file run, as run (#54)
    st = json.loads(run_cli("release", "status", f, "--json").stdout)
    assert {s["name"]: s["status"] for s in st["stages"]} == {"base": "never run", "merge": "done", "eval": "failed"}
    assert st["last_run"]["outcome"] == "failed"

    # An output edited behind the release's back no longer verifies: the stage runs again. Its new
    # output has the content eval already judged (the merge is deterministic), so eval is reused.
    _write(f, tiny_qwen2_tied, tiny_lora_tied, _stages())
    (merged / "config.json").write_text((merged / "config.json").read_text() + " ")
    r = run_cli("release", "run", f, "--json")
    assert r.exit_code == 0, r.stderr
    assert _actions(r.stdout) == {"base": "skipped", "merge": "ran", "eval": "skipped"}
    assert "no longer matches its hash" in r.stderr

    # --from re-runs that stage and the ones after it.
    r = run_cli("release", "run", f, "--from", "eval", "--json")
    assert _actions(r.stdout) == {"base": "skipped", "merge": "skipped", "eval": "ran"}
    r = run_cli("release", "run", f, "--from", "nope")
    assert r.exit_code == 2 and "--from" in r.stderr

    # Live stages naming running servers (none answers here): promote is gated by the eval of the model
    # the candidate serves; a candidate no eval stage judged is refused before anything starts.
    def live(candidate_input: str) -> list[dict]:
        return [*_stages(),
                {"stage": "serve", "name": "stable", "options": {"role": "stable", "url": "http://127.0.0.1:9"}},
                {"stage": "serve", "name": "canary", "input": candidate_input,
                 "options": {"role": "candidate", "url": "http://127.0.0.1:9"}},
                {"stage": "router", "options": {"url": "http://127.0.0.1:9"}},
                {"stage": "promote", "options": {"steps": [50, 100]}}]
    _write(f, tiny_qwen2_tied, tiny_lora_tied, live("merge"))
    r = run_cli("release", "run", f, "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    assert _actions(r.stdout) == {"base": "skip", "merge": "skip", "eval": "skip", "stable": "run", "canary": "run",
                                  "router": "run", "promote": "run"}
    _write(f, tiny_qwen2_tied, tiny_lora_tied, live("base"))
    r = run_cli("release", "run", f, "--dry-run")
    assert r.exit_code == 2 and "no eval stage evaluated the model the candidate serves" in r.stderr


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != "qlift.json"}


KILLED_MID_WRITE = [
    pytest.param({"stage": "merge", "options": {"verify": False, "max_shard_size": "2MB"}}, id="merge"),
    # FP8 needs no calibration, so two runs write the same bytes; the kill lands while llm-compressor works.
    pytest.param({"stage": "quantize", "input": "base", "options": {"method": "fp8"}}, id="quantize",
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize("stage", KILLED_MID_WRITE)
def test_sigkill_mid_stage_resumes_there_byte_identical(tmp_path: Path, tiny_qwen2_tied: Path,
                                                        tiny_lora_tied: Path, stage: dict) -> None:
    name = stage["stage"]
    ref = _write(tmp_path / "ref.yaml", tiny_qwen2_tied, tiny_lora_tied, [stage], out="ref-out")
    p = _qlift("release", "run", ref, "--json", timeout=600)
    assert p.returncode == 0, p.stderr
    want = Path(json.loads(p.stdout)["stages"][1]["output"])

    f = _write(tmp_path / "release.yaml", tiny_qwen2_tied, tiny_lora_tied, [stage])
    journal = tmp_path / "out" / "release.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "qlift", "release", "run", str(f)], stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    killed_mid_write = False
    while time.monotonic() < deadline and proc.poll() is None:
        if list((tmp_path / "out").glob(f".{name}-*.partial")):  # its temp output exists: the stage is under way
            proc.send_signal(signal.SIGKILL)
            killed_mid_write = True
            break
        time.sleep(0.01)
    proc.wait()
    assert killed_mid_write, f"the {name} finished before it could be killed"
    with sqlite3.connect(journal) as db:
        assert db.execute("SELECT status FROM stages WHERE name=?", (name,)).fetchone() == ("running",)
    assert not any(p.name.startswith(f"{name}-") for p in (tmp_path / "out").iterdir())  # nothing half-written placed

    p = _qlift("release", "run", f, "--json", timeout=600)
    assert p.returncode == 0, p.stderr
    assert f"{name} ({name}): running (the last run did not finish it (resuming here))" in p.stderr
    got = Path(json.loads(p.stdout)["stages"][1]["output"])
    assert got.name == want.name  # same key
    assert not list((tmp_path / "out").glob(f".{name}-*.partial"))
    assert _files(got) == _files(want)
    outputs = json.loads((got / "qlift.json").read_text())["outputs"]
    assert {k: v["sha256"] for k, v in outputs.items()} == \
        {k: v["sha256"] for k, v in json.loads((want / "qlift.json").read_text())["outputs"].items()}


def test_an_output_edited_in_place_with_size_and_mtime_restored_runs_again(
        run_cli, tmp_path: Path, tiny_qwen2_tied: Path, tiny_lora_tied: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The release trusts an output unread only while each file keeps the size, mtime, inode and ctime journaled
    when its stage finished (before: size and mtime, so an edit that put them back was taken as cached)."""
    f = _write(tmp_path / "release.yaml", tiny_qwen2_tied, tiny_lora_tied, [{"stage": "merge",
                                                                              "options": {"verify": False}}])
    r = run_cli("release", "run", f, "--json")
    assert r.exit_code == 0, r.stderr
    merged = Path(json.loads(r.stdout)["stages"][1]["output"])

    # One byte changed in place, size and mtime put back: the merge runs again.
    config = merged / "config.json"
    text, st = config.read_text(), config.stat()
    edited = text.replace('"hidden_size": 64', '"hidden_size": 65')
    assert edited != text and len(edited) == len(text)
    with open(config, "r+", encoding="utf-8") as fh:  # in place: the same inode
        fh.write(edited)
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (config.stat().st_size, config.stat().st_mtime_ns, config.stat().st_ino) == \
        (st.st_size, st.st_mtime_ns, st.st_ino)
    plan = json.loads(run_cli("release", "run", f, "--dry-run", "--json").stdout)["stages"]
    assert plan[1]["action"] == "run" and "no longer matches its hash" in plan[1]["reason"]
    r = run_cli("release", "run", f, "--json")
    assert r.exit_code == 0 and _actions(r.stdout)["merge"] == "ran", r.stderr
    assert config.read_text() == text

    # Same content, new inode and ctime (a copy that keeps mtimes): read once, still cached,
    # then trusted unread again.
    from qlift import lineage

    read: list[Path] = []
    real = lineage.sha256_files
    monkeypatch.setattr(lineage, "sha256_files", lambda paths, *a: real([read.append(p) or p for p in paths], *a))
    shutil.copytree(merged, tmp_path / "copy")
    shutil.rmtree(merged)
    (tmp_path / "copy").rename(merged)
    for reads_it in (True, False):
        read.clear()
        r = run_cli("release", "run", f, "--json")
        assert r.exit_code == 0 and _actions(r.stdout)["merge"] == "skipped", r.stderr
        assert (merged / "config.json" in read) is reads_it, read
    with sqlite3.connect(tmp_path / "out" / "release.sqlite") as db:
        files = json.loads(db.execute("SELECT files FROM stages WHERE name='merge'").fetchone()[0])
    st = (merged / "config.json").stat()
    assert files["config.json"] == [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def test_one_writer_per_release_and_a_killed_run_is_called_killed(tmp_path: Path, tiny_qwen2_tied: Path,
                                                                  tiny_lora_tied: Path) -> None:
    """A second `release run` of a release whose run is under way is refused in one line naming the first's pid
    (before, it took the first's running stage for an interrupted one, deleted its live .partial, and the first
    died with exit 70); the first finishes. `release status` after a SIGKILL says killed, not running forever."""
    f = _write(tmp_path / "release.yaml", tiny_qwen2_tied, tiny_lora_tied,
               [{"stage": "merge", "options": {"verify": False, "max_shard_size": "2MB"}}])
    out = tmp_path / "out"

    def start_and_freeze() -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-m", "qlift", "release", "run", str(f)], stderr=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 300
        while not list(out.glob(".merge-*.partial")):  # the merge is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.01)
        proc.send_signal(signal.SIGSTOP)
        return proc

    first = start_and_freeze()
    try:
        second = _qlift("release", "run", f)
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 1 and len(lines) == 1, second.stderr
        assert f"release run pid {first.pid} holds {out}" in lines[0]
        assert list(out.glob(".merge-*.partial"))  # the first's work in progress is untouched
        status = _qlift("release", "status", f, "--json")
        assert json.loads(status.stdout)["last_run"]["outcome"] == f"running (pid {first.pid})"
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(300) == 0, first.stderr.read() if first.stderr else ""

    for journal_file in out.glob("release.sqlite*"):  # a fresh journal: the merge runs again, killed this time
        journal_file.unlink()
    killed = start_and_freeze()
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    status = _qlift("release", "status", f)
    assert status.returncode == 0 and f"killed (pid {killed.pid} gone); `qlift release run {f}` resumes it" \
        in status.stdout, status.stdout
    stages = {s["name"]: s["status"] for s in json.loads(_qlift("release", "status", f, "--json").stdout)["stages"]}
    assert stages["merge"] == "interrupted", stages  # not `running`: nothing runs it


def test_shipped_example_plans(run_cli) -> None:
    """examples/release.yaml validates and plans (a plan runs nothing and writes nothing)."""
    r = run_cli("release", "run", REPO / "examples" / "release.yaml", "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert [s["name"] for s in plan["stages"]] == ["base", "merge", "awq", "eval", "base-awq", "eval-bf16", "stable",
                                                   "canary", "router", "promote"]
    assert {s["action"] for s in plan["stages"]} <= {"run", "skip", "blocked"}
    assert plan["stages"][0]["kind"] == "import"
    st = run_cli("release", "status", REPO / "examples" / "release.yaml")
    assert st.exit_code == 0 and "promote" in st.stdout


def test_a_serve_stage_passes_the_serve_stage_its_options(tmp_path: Path) -> None:
    """A serve stage's options are `qlift serve`'s own (--lora included, relative to the file), plus the release's."""
    from qlift.models.ref import ModelRef
    from qlift.release import load_release
    from qlift.release.live import serve_request
    from qlift.serve.options import ServeOptions

    f = tmp_path / "release.yaml"
    f.write_text(yaml.safe_dump({"base": {"path": "base"}, "stages": [{"stage": "serve", "options": {
        "role": "stable", "recipe": "cpu", "sets": ["max_model_len=2048"], "timeout_s": 120, "core": 1,
        "loras": {"tickets": "adapters/tickets"}}}]}), encoding="utf-8")
    stage = load_release(f).stages[0]
    model = ModelRef(base=Path("m"), content_hash="sha256:0")
    inputs, given = serve_request(model, stage.options)  # type: ignore[arg-type]
    assert isinstance(given, ServeOptions)
    assert (inputs.model, given.recipe, given.sets, given.port, given.timeout_s, given.served_model_name) == \
        (model, "cpu", ("max_model_len=2048",), 0, 120, "qlift-stable")
    assert given.loras == {"tickets": tmp_path / "adapters" / "tickets"} and given.host == "127.0.0.1"
    assert inputs.env == {"VLLM_CPU_OMP_THREADS_BIND": "1"}


def test_a_router_stage_passes_the_router_its_own_settings(tmp_path: Path) -> None:
    """A router stage's options are `qlift router`'s own settings (file paths relative to the file) plus the
    release's; the router gets a plain RouterConfig whose backends are the release's servers, all traffic on stable."""
    from qlift.release import load_release
    from qlift.release.live import router_config
    from qlift.router.config import RouterConfig

    f = tmp_path / "release.yaml"
    f.write_text(yaml.safe_dump({"base": {"path": "base"}, "stages": [
        {"stage": "serve", "name": "stable", "options": {"role": "stable", "url": "http://127.0.0.1:9"}},
        {"stage": "serve", "name": "canary", "options": {"url": "http://127.0.0.1:9"}},
        {"stage": "router", "options": {"port": 8100, "api_keys_file": "keys.txt", "access_log": "-",
                                        "limits": {"requests_per_s": 5}, "timeouts": {"idle_s": 9}}}]}),
        encoding="utf-8")
    stage = load_release(f).stages[2]
    config = router_config(stage.options, {"stable": "http://127.0.0.1:8001/v1",  # type: ignore[arg-type]
                                           "canary": "http://127.0.0.1:8002"},
                           model_hashes={"stable": "sha256:aa", "canary": "sha256:bb"})
    assert type(config) is RouterConfig
    assert (config.port, config.public_model, config.host, config.api_keys_file, config.access_log) == \
        (8100, "release", "127.0.0.1", tmp_path / "keys.txt", "-")
    assert (config.limits.requests_per_s, config.timeouts.idle_s, config.timeouts.connect_s) == (5, 9, 5.0)
    assert [(b.name, b.url, b.weight, b.model_hash) for b in config.backends] == [
        ("stable", "http://127.0.0.1:8001", 100, "sha256:aa"), ("canary", "http://127.0.0.1:8002", 0, "sha256:bb")]


def test_a_killed_runs_router_is_stopped_by_pid_and_a_reused_pid_left_alone(tmp_path: Path) -> None:
    """What a SIGKILLed run left running (its router, journaled by pid as it started) the next run stops; a
    journaled pid that now runs something else is not the release's to stop."""
    from qlift import router
    from qlift.release.journal import ReleaseJournal
    from qlift.release.live import router_config, stop_leftovers
    from qlift.release.spec import RouterStageOptions

    config = router_config(RouterStageOptions(), {"stable": "http://127.0.0.1:9", "canary": "http://127.0.0.1:9"})
    other = subprocess.Popen(["sleep", "60"])
    with ReleaseJournal(tmp_path / "release.sqlite") as journal:
        run_id = journal.start_run(tmp_path / "release.yaml")
        left = router.start(router.RouterInputs("t"), config, log_path=tmp_path / "logs" / "router.log",
                            on_started=lambda pid: journal.add_server(pid, "router", run_id, ""))
        journal.add_server(other.pid, "stable", run_id, "")
        try:
            assert left.running() and stop_leftovers(journal) == [left.pid]
            assert left.wait(timeout=30) == 0  # SIGTERM: it drained and exited
            assert other.poll() is None and journal.running_servers() == []
        finally:
            left.stop()
            other.kill()
            other.wait()
