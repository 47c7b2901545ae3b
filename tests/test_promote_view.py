"""What a person sees of a rollout: `promote status` text (every check against its limit, notes once,
wrapped), the shadow phase's lines on stderr, `promote report`'s HTML page, and `promote start`
refusing a stable the router reports DOWN. The journals are written by the real controller on a fake
clock (tests/rollout_journals.py); the DOWN stable is a real router with nothing behind the stable."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from html import unescape
from pathlib import Path
from typing import Any

import pytest
import rollout_journals
from faults import RouterProcess, TinyBackend

from qlift.errors import ExternalToolError
from qlift.rollout.api import status
from qlift.rollout.dataplane import RouterDataPlane, check_stable_up
from qlift.rollout.journal import Journal
from qlift.rollout.view import VERDICTS
from qlift.router.client import RouterClient
from qlift.vllm.process import free_port

TOKEN = "view-test-token"
COLS = 100


@pytest.fixture(scope="module")
def journals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A promotion after a shadow phase, and a rollback on looping answers (with a window of no canary
    traffic first), each journaled once for the whole module."""
    d = tmp_path_factory.mktemp("journals")
    out = {"promoted": d / "promoted.sqlite", "looped": d / "looped.sqlite"}
    assert rollout_journals.promoted(out["promoted"]) == "promoted"
    assert rollout_journals.looped(out["looped"]) == "rolled_back"
    return out


@pytest.fixture(autouse=True)
def _columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(COLS))


def all_windows(st: dict[str, Any]) -> list[dict[str, Any]]:
    """Every judged window `status --json` shows, the shadow phase's first."""
    return (st["shadow"]["windows"] if st.get("shadow") else []) + [w for s in st["steps"] for w in s["windows"]]


def cell(c: dict[str, Any]) -> str:
    """A check's cell as the journal's numbers say it should read."""
    verdict = VERDICTS[c["status"]]
    if c["canary"] == 0 and c["stable"] == 0 and c["ratio"] is not None:
        return f"{c['name']} {verdict}"
    if c["ratio"] is not None:
        return f"{c['name']} {c['ratio']:.2f}x/{c['limit']:g} {verdict}"
    if c["limit"] is None:  # a paired answer check: both versions' shares on the same prompts
        return f"{c['name']} {c['canary']:.3g} vs {c['stable']:.3g} {verdict}"
    label = "loss-win " if c["name"] == "judge" else ""
    return f"{c['name']} {label}{c['canary']:.3g}/{c['limit']:g} {verdict}"


def test_status_shows_each_window_with_every_check_against_its_limit(run_cli, journals) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("promote", "status", "--journal", journals["promoted"])
    assert r.exit_code == 0, r.stderr
    st = json.loads(run_cli("promote", "status", "--journal", journals["promoted"], "--json").stdout)
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= COLS, max(lines, key=len)
    # a window's cells may wrap between cells, never inside one: rejoin the continuation lines
    flat = re.sub(r"\n {6}", " · ", r.stdout).replace(" ·  · ", " · ")
    windows = all_windows(st)
    assert len(windows) == 6  # three shadow windows, two at 10% (one held), one at 50%
    for w in windows:
        when = f"{w['started_at'][11:19]}-{w['ended_at'][11:19]}"
        head = f"  {when}  {w['action']:<8} canary {w['canary']['requests']} req"
        assert head in r.stdout, head
        for c in w["checks"]:
            if c["status"] != "skipped":
                assert cell(c) in flat, cell(c)
    held = windows[3]
    assert held["action"] == "hold" and "canary_requests 3/5 hold" in flat
    latency = next(c for c in held["checks"] if c["name"] == "latency")
    assert latency["ratio"] == pytest.approx(1.2, abs=0.01) and latency["limit"] == 1.5  # what the script sent
    assert "why: insufficient: canary served 3 requests < min_requests 5" in r.stdout
    # the note every window carries is said once a window, the carried-over window included
    assert r.stdout.count("note: stable and canary share one server") == 3
    assert "note: cumulative over 2 windows of this step" in r.stdout
    assert "p50" not in r.stdout.split("judge compares")[1].split("step 1/3")[0].replace("latency_quantile", "")
    assert "reason: canary c at 100%: promoted" in r.stdout


def test_status_of_a_rollback_shows_no_traffic_as_such_and_the_examples(run_cli, journals) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("promote", "status", "--journal", journals["looped"])
    assert r.exit_code == 0, r.stderr
    assert "0/0/-s" not in r.stdout
    first = r.stdout.split("step 1/3")[1].splitlines()[1]
    assert "hold" in first and "canary no requests · stable 40 req, 0 err" in first, first
    assert "loops inf/2 FAIL" in r.stdout
    assert "step 3/3, canary 100%: not reached" in r.stdout and "no window" not in r.stdout
    assert "loops examples" in r.stdout and "canary: " + rollout_journals.LOOP[:60] in r.stdout


def test_a_missing_journal_or_rollout_exits_4(run_cli, tmp_path: Path, journals) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("promote", "status", "--journal", tmp_path / "none.sqlite")
    assert r.exit_code == 4 and "no rollout journal" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert not (tmp_path / "none.sqlite").exists()
    r = run_cli("promote", "status", "--journal", journals["looped"], "--rollout", "7")
    assert r.exit_code == 4 and "no rollout 7" in r.stderr, r.stderr
    r = run_cli("promote", "report", "--journal", tmp_path / "none.sqlite", "-o", tmp_path / "r.html")
    assert r.exit_code == 4 and not (tmp_path / "r.html").exists()


def test_shadow_windows_get_their_line_on_stderr(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="qlift.rollout.controller"):
        rollout_journals.promoted(tmp_path / "j.sqlite")
    lines = [r.getMessage() for r in caplog.records]
    shadow = [m for m in lines if m.startswith("shadow window (20% mirrored)")]
    assert [m.split(": ")[1] for m in shadow] == ["6 pairs", "18 pairs", "12 pairs"]  # a held window's carry over
    assert [m.split(": ")[2].split(" ")[0] for m in shadow] == ["hold", "pass", "advance"]
    steps = [m for m in lines if m.startswith("window at ")]
    assert len(steps) == 3
    # each judged window's checks follow it on the next line: latency and TTFT against their limits, what
    # held or failed, and how many more passed
    for m in shadow + steps:
        checks = lines[lines.index(m) + 1]
        assert re.search(r"latency 1\.\d\dx/1\.5 ok · ttft 1\.\d\dx/1\.5 ok · \d+ more ok$", checks), checks
    assert lines[lines.index(shadow[0]) + 1].startswith("  canary_requests 6/8 hold · latency")


def test_report_draws_the_journals_numbers(run_cli, tmp_path: Path, journals) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "rollout.html"
    r = run_cli("promote", "report", "--journal", journals["promoted"], "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    written = json.loads(r.stdout)
    assert written["report"] == str(out) and written["state"] == "promoted" and written["windows"] == 6
    page = out.read_text()
    st = status(journals["promoted"])
    windows = all_windows(st)
    # self-contained: no script, nothing fetched
    assert "<script" not in page and not re.search(r'(src|href)="', page) and "@import" not in page
    assert 'data-state="promoted"' in page and "canary c at 100%: promoted" in page
    # the weights' step line: one point a weight change, the shadow phase shaded
    assert re.findall(r'class="change" data-weight="(\d+)"', page) == ["0", "10", "50", "100"]
    assert 'class="shadow-phase"' in page and "shadow: 20% mirrored" in page
    # the verdict strip, in the journal's order
    assert re.findall(r'<g class="window" data-action="(\w+)"', page) == [w["action"] for w in windows]
    # canary vs stable with the limit (stable x ratio limit) for latency and TTFT
    for name in ("latency", "ttft"):
        chart = page.split(f'data-chart="{name}"')[1].split("</svg>")[0]
        checks = [next(c for c in w["checks"] if c["name"] == name) for w in windows]
        assert re.findall(r'point canary" data-value="([^"]+)"', chart) == [f"{c['canary']:.3g}" for c in checks]
        assert re.findall(r'point stable" data-value="([^"]+)"', chart) == [f"{c['stable']:.3g}" for c in checks]
        assert re.findall(r'series limit" data-value="([^"]+)"', chart) == [
            f"{c['stable'] * c['limit']:.3g}" for c in checks]
    assert "per-token latency" in page
    # every check's measure and verdict, every window
    table = unescape(page.split('<table class="checks">')[1].split("</table>")[0])
    for w in windows:
        for c in w["checks"]:
            if c["status"] != "skipped":
                assert cell(c).split(" ", 1)[1] in table, cell(c)
    assert "No answer check kept an example" in page


def test_report_keeps_the_worst_examples_escaped_and_never_overwrites(run_cli, tmp_path: Path, journals) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "rollout.html"
    assert run_cli("promote", "report", "--journal", journals["looped"], "-o", out).exit_code == 0
    page = out.read_text()
    assert 'data-state="rolled_back"' in page and "ROLLED BACK" in page and "ratio inf &gt; 2.0" in page
    rows = re.findall(r'<tr class="example" data-check="(\w+)">', page)
    # the three each failing check kept (the same loop to three prompts): loops first; the loop also takes up none
    # of the prompt (disengaged) and repeats a sentence (text_shape)
    assert rows[:3] == ["loops"] * 3 and all(rows.count(name) == 3 for name in rows), rows
    assert rollout_journals.PROMPT.format(2).replace("?", "?") in page
    before = out.stat().st_mtime_ns
    again = run_cli("promote", "report", "--journal", journals["looped"], "-o", out)
    assert again.exit_code == 3 and "--force" in again.stderr and out.stat().st_mtime_ns == before
    forced = run_cli("promote", "report", "--journal", journals["promoted"], "-o", out, "--force")
    assert forced.exit_code == 0 and 'data-state="promoted"' in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollout.html"]  # no temp file left behind
    into = run_cli("promote", "report", "--journal", journals["looped"], "-o", journals["looped"], "--force")
    assert into.exit_code == 2 and "input" in into.stderr


def test_a_rollout_that_has_not_judged_a_window_yet_renders(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    journal = tmp_path / "j.sqlite"
    sp = rollout_journals.spec()
    with Journal(journal) as j:
        j.create(sp.model_dump(mode="json"), sp.stable, sp.canary)
    text = run_cli("promote", "status", "--journal", journal)
    assert text.exit_code == 0 and "step 1/3, canary 10%: not started" in text.stdout, text.stdout
    r = run_cli("promote", "report", "--journal", journal, "-o", tmp_path / "r.html")
    assert r.exit_code == 0, r.stderr
    page = (tmp_path / "r.html").read_text()
    assert 'data-state="progressing"' in page and "no latency numbers in any window" in page


def test_start_refuses_a_stable_the_router_reports_down(run_cli, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)
    nothing = f"http://127.0.0.1:{free_port()}"
    with TinyBackend("m") as canary, RouterProcess(
            "--backend", f"stable={nothing}#m", "--backend", f"canary={canary.url}#m", "--weight", "stable=100",
            "--weight", "canary=0", "--public-model", "m", log_path=tmp_path / "router.log", token=TOKEN) as router:
        client = RouterClient(router.url, TOKEN)
        deadline = time.monotonic() + 20
        while client.state().backend("stable").healthy and time.monotonic() < deadline:
            time.sleep(0.1)
        journal = tmp_path / "j.sqlite"
        r = run_cli("promote", "start", "--router", router.url, "--stable", "stable", "--canary", "canary",
                    "--journal", journal, "--interval", "1s")
        assert r.exit_code == 8, (r.exit_code, r.stderr)
        assert "stable stable DOWN" in r.stderr and "--allow-stable-down" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert client.state().weights == {"stable": 100, "canary": 0}
        assert run_cli("promote", "status", "--journal", journal).exit_code == 4  # nothing journaled
        plane = RouterDataPlane(router.url, TOKEN)
        check_stable_up(plane, "stable", allow_down=True)  # the flag lets it through
        with pytest.raises(ExternalToolError):
            check_stable_up(plane, "stable", allow_down=False)
        check_stable_up(plane, "canary", allow_down=False)  # an up backend passes


def test_the_demo_ends_with_what_the_rollout_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make demo`'s summary: every window's verdict with the numbers the judge compared, the decision, and the
    HTML report it writes; the numbers are the journal's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo", Path(__file__).parents[1] / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "demo", demo)  # its dataclasses look their module up
    spec.loader.exec_module(demo)
    journal = tmp_path / "j.sqlite"
    rollout_journals.looped(journal)
    lines = demo.rollout_findings(demo.Demo(tmp_path, False), journal)
    assert lines[0].startswith("rollout: rolled_back: loops:")
    assert any("loops inf/2 FAIL" in line for line in lines) and any("latency 1.10x/1.5 ok" in line for line in lines)
    assert (tmp_path / "rollout.html").is_file() and str(tmp_path / "rollout.html") in lines[-1]
