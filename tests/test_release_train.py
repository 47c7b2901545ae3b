"""The next release through a release file (#54): a promote stage with `next:` rolls the next version out over
whatever holds 100% of one running `qlift router` (a `url:` router stage), as `qlift promote start --next` does.
Three releases in a row of one file, edited as a release engineer edits it (v1 at 100% -> v2 promoted -> a bad
v3 rolled back -> v4 promoted): the router process never restarts and ends serving only v4; each release's status
says done or rolled back; a retirement the router did not answer is settled by the next `release run`. Small
scripted backends; the router, the release, the controller and the judge are the product's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from faults import RouterProcess, ScriptedBackend, helpful_order_answer, refusing_answer

from qlift.errors import ExternalToolError

TOKEN = "release-train-token"
PROMOTE = {"steps": [50, 100], "interval": "2s", "analysis": {"min_requests": 10}}


def _release(path: Path, base: Path, router: str, nxt: str, candidate: str | None,
             promote: dict[str, Any] = PROMOTE) -> Path:
    """The file a release engineer edits for each release: the next version's name (and its server)."""
    prompts = path.parent / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Where is my order A{i:04d}?"}]})
                               + "\n" for i in range(20)), encoding="utf-8")
    stages: list[dict[str, Any]] = []
    if candidate is not None:
        stages.append({"stage": "serve", "name": "candidate", "options": {"role": "candidate", "url": candidate}})
    stages += [{"stage": "router", "options": {"url": router, "public_model": "pub"}},
               {"stage": "promote", "next": nxt, "options": promote,
                "load": {"prompts": "prompts.jsonl", "concurrency": 3, "max_requests": 100000, "max_tokens": 16}}]
    doc = {"name": "train", "out": "out", "base": {"path": str(base)}, "stages": stages}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _status(run_cli: Any, f: Path) -> dict[str, Any]:
    r = run_cli("release", "status", f, "--json")
    assert r.exit_code == 0, r.stderr
    return dict(json.loads(r.stdout))


@pytest.mark.timeout(120)
def test_three_releases_in_a_row_through_one_running_router(
        run_cli: Any, tmp_path: Path, tiny_qwen2_tied: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)
    f = tmp_path / "release.yaml"
    with ScriptedBackend("m-v1", helpful_order_answer) as v1, ScriptedBackend("m-v2", helpful_order_answer) as v2, \
            ScriptedBackend("m-v3", refusing_answer) as v3, ScriptedBackend("m-v4", helpful_order_answer) as v4, \
            RouterProcess("--backend", f"v1={v1.url}#m-v1", "--public-model", "pub",
                          log_path=tmp_path / "router.log", token=TOKEN) as router:
        admin, pid = router.admin(), router.proc.pid if router.proc else None
        started = admin.state().started_at

        # Release 2: v2 (the candidate serve stage's server) over v1, which holds 100%: the expected start.
        _release(f, tiny_qwen2_tied, router.url, "v2", v2.url)
        plan = run_cli("release", "run", f, "--dry-run", "--json")
        promote = {s["name"]: s for s in json.loads(plan.stdout)["stages"]}["promote"]
        assert promote["warning"] == f"will run promote: moves live traffic on {router.url}, rolling v2 out over v1 " \
                                     "(now v1=100)", plan.stdout
        with monkeypatch.context() as m:  # the router does not answer the retirement: v1 stays, owed
            def unreachable(self: Any, name: str) -> Any:
                raise ExternalToolError("router did not answer DELETE /admin/backends", tool="router")

            m.setattr("qlift.router.client.RouterClient.retire_backend", unreachable)
            r = run_cli("release", "run", f, "--yes", "--json")
        assert r.exit_code == 0, r.stderr[-3000:]
        assert "too little traffic yet" not in r.stderr and "cannot reach their minimum" not in r.stderr, r.stderr
        assert admin.state().weights == {"v1": 0, "v2": 100}
        st = _status(run_cli, f)
        assert st["last_run"]["outcome"] == "done" and st["rollout"]["state"] == "promoted", st
        owed = st["rollout"]["next"]
        assert len(owed) == 1 and owed[0].startswith("backend v1 is still on the router at weight 0"), owed

        # A file whose windows its load cannot fill: the plan says so up front, in one line.
        _release(f, tiny_qwen2_tied, router.url, f"v3={v3.url}#m-v3", None,
                 {**PROMOTE, "analysis": {"min_requests": 10**6}})
        plan = run_cli("release", "run", f, "--dry-run")
        said = [line for line in plan.stderr.splitlines() if "cannot reach their minimum" in line]
        assert len(said) == 1 and said[0].startswith("promote: the windows cannot reach their minimum at this "
                                                     "file's load ("), plan.stderr

        # Release 3: a bad v3 named by next: NAME=URL#MODEL (no serve stage); v1 retired first, then rolled back.
        _release(f, tiny_qwen2_tied, router.url, f"v3={v3.url}#m-v3", None)
        r = run_cli("release", "run", f, "--yes", "--json")
        assert r.exit_code == 10, r.stderr[-3000:]
        assert "retired backend v1 from the router" in r.stderr, r.stderr[-3000:]
        assert admin.state().weights == {"v2": 100}
        st = _status(run_cli, f)
        assert st["last_run"]["outcome"] == "failed" and st["rollout"]["state"] == "rolled_back", st
        assert st["rollout"]["next"] == []

        # Release 4: v4 over v2; v2 retired.
        _release(f, tiny_qwen2_tied, router.url, "v4", v4.url)
        r = run_cli("release", "run", f, "--yes", "--json")
        assert r.exit_code == 0, r.stderr[-3000:]
        st = _status(run_cli, f)
        assert st["last_run"]["outcome"] == "done" and st["rollout"]["state"] == "promoted", st
        assert st["rollout"]["next"] == []

        state = admin.state()
        assert [b.name for b in state.backends] == ["v4"] and state.weights == {"v4": 100}
        assert router.proc is not None and router.proc.pid == pid and router.proc.poll() is None
        assert state.started_at == started  # the same router process throughout
        assert v3.requests > 0 and v4.requests > 0  # each canary served the load on the way

        # Running it again: promoted already, nothing moves.
        r = run_cli("release", "run", f, "--yes", "--json")
        assert r.exit_code == 0 and admin.state().weights == {"v4": 100}, r.stderr[-2000:]


@pytest.mark.parametrize(("edit", "said"), [
    ({"stable": True}, "with next:, the stable is the version that holds 100% of the router now, so stage 'old'"),
    ({"next": "v3"}, "next: v3 names no server, and no serve stage has role: candidate"),
    ({"next": "v3=http://127.0.0.1:8003", "candidate": True}, "names the candidate's server, and so does stage"),
    ({"router_url": None}, "next: rolls the next version out on a running qlift router, and this release starts"),
    ({"next": "v 3"}, "field 'next': backend name 'v 3' must be letters"),
])
def test_a_next_release_file_is_refused_in_one_line(tmp_path: Path, edit: dict[str, Any], said: str) -> None:
    from qlift.errors import BadInputError
    from qlift.release.spec import load_release

    stages: list[dict[str, Any]] = []
    if edit.get("stable"):
        stages.append({"stage": "serve", "name": "old", "options": {"role": "stable", "url": "http://127.0.0.1:8001"}})
    if edit.get("candidate"):
        stages.append({"stage": "serve", "name": "new", "options": {"role": "candidate",
                                                                  "url": "http://127.0.0.1:8003"}})
    router = edit.get("router_url", "http://127.0.0.1:8000")
    stages += [{"stage": "router", "options": {"url": router} if router else {}},
               {"stage": "promote", "next": edit.get("next", "v3=http://127.0.0.1:8003#m")}]
    f = tmp_path / "release.yaml"
    f.write_text(yaml.safe_dump({"base": {"path": str(tmp_path)}, "stages": stages}), encoding="utf-8")
    with pytest.raises(BadInputError) as exc:
        load_release(f)
    assert said in exc.value.one_line(), exc.value.one_line()


def test_only_promote_takes_next(tmp_path: Path) -> None:
    from qlift.errors import BadInputError
    from qlift.release.spec import load_release

    f = tmp_path / "release.yaml"
    f.write_text(yaml.safe_dump({"base": {"path": str(tmp_path)}, "stages": [
        {"stage": "router", "next": "v3", "options": {"url": "http://127.0.0.1:8000"}}]}), encoding="utf-8")
    with pytest.raises(BadInputError, match="only a promote stage takes next"):
        load_release(f)
