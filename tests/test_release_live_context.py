"""The release's live context (#40): promote's options are their own class, validated alone, and the release builds
the rollout's spec from them with its versions and router; the router's admin token travels in the rollout's
typed inputs, never through an edit of the environment in ``qlift/release``."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import yaml

from qlift.errors import BadInputError
from qlift.release import live
from qlift.release.kinds import TABLE, StageKind
from qlift.release.spec import load_release
from qlift.rollout.spec import SPEC_FLAGS, PromoteOptions, RolloutSpec, spec_option_fields

REPO = Path(__file__).resolve().parent.parent


def _release(tmp_path: Path, promote: dict[str, object]) -> Path:
    (tmp_path / "base").mkdir(exist_ok=True)
    doc = {"base": {"path": "base"}, "stages": [
        {"stage": "serve", "name": "stable", "options": {"role": "stable", "url": "http://127.0.0.1:1"}},
        {"stage": "serve", "name": "canary", "options": {"role": "candidate", "url": "http://127.0.0.1:2"}},
        {"stage": "router", "options": {"url": "http://127.0.0.1:3"}},
        {"stage": "promote", "options": promote}]}
    f = tmp_path / "release.yaml"
    f.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return f


def test_promote_options_are_the_spec_less_what_the_release_fills_in() -> None:
    managed = set(TABLE[StageKind.PROMOTE].managed)
    assert TABLE[StageKind.PROMOTE].options is PromoteOptions
    assert not managed & set(PromoteOptions.model_fields)
    assert set(RolloutSpec.model_fields) == set(PromoteOptions.model_fields) | managed
    assert PromoteOptions().steps == [10, 50, 100]  # valid alone: no versions, no router


def test_a_release_file_promote_stage_is_promote_options_and_becomes_the_rollouts_spec(tmp_path: Path) -> None:
    release = load_release(_release(tmp_path, {"steps": "10,100", "interval": "20s", "bake": 1,
                                               "analysis": {"min_requests": 5}}))
    options = release.stage("promote").opts(PromoteOptions)
    assert type(options) is PromoteOptions and not hasattr(options, "router")
    spec = options.rollout_spec(stable="stable", canary="canary", router="http://127.0.0.1:3",
                                canary_hash="sha256:abc")
    assert isinstance(spec, RolloutSpec)
    assert (spec.steps, spec.interval, spec.bake, spec.analysis.min_requests) == ([10, 100], 20.0, 1, 5)
    assert (spec.stable, spec.canary, spec.router, spec.canary_hash) == ("stable", "canary", "http://127.0.0.1:3",
                                                                          "sha256:abc")


@pytest.mark.parametrize(("promote", "message"), [
    ({"bake": 1, "steps": [100]}, "bake needs a step below 100 first"),
    ({"data_plane": "nginx", "nginx": {"prefix": "/tmp/n"}}, "nginx needs backends: URLs for stable, canary"),
    ({"router": "http://127.0.0.1:9"}, "set by the release"),
])
def test_a_promote_stage_the_release_cannot_run_is_refused_when_the_file_is_loaded(
        tmp_path: Path, promote: dict[str, object], message: str) -> None:
    with pytest.raises(BadInputError) as exc:
        load_release(_release(tmp_path, promote))
    assert message in exc.value.one_line() and "stage 'promote'" in exc.value.one_line()


def test_the_versions_rules_still_hold_for_a_whole_spec() -> None:
    with pytest.raises(ValueError, match="stable and canary must be different versions"):
        RolloutSpec(stable="a", canary="a", router="http://r")
    with pytest.raises(ValueError, match="the builtin data plane needs router"):
        RolloutSpec(stable="a", canary="b")
    with pytest.raises(ValueError, match="gateway.backends lacks b"):
        RolloutSpec.model_validate({"stable": "a", "canary": "b", "data_plane": "gateway-api", "gateway": {
            "parent_refs": [{"name": "gw"}], "backends": {"a": {"name": "svc-a"}}}})


def test_promote_start_flags_keep_their_order() -> None:
    assert [f.name for f in spec_option_fields("spec")] == [f"spec__{name}" for name in SPEC_FLAGS]


def test_the_release_hands_the_router_token_to_the_rollout_in_its_inputs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import qlift.rollout

    monkeypatch.delenv("QLIFT_ROUTER_TOKEN", raising=False)
    seen = []

    def spy(inputs: qlift.rollout.RolloutInputs, spec: RolloutSpec) -> str:
        seen.append((inputs, os.environ.get("QLIFT_ROUTER_TOKEN")))
        return "done"

    monkeypatch.setattr(qlift.rollout, "run", spy)
    spec = PromoteOptions().rollout_spec(stable="stable", canary="canary", router="http://127.0.0.1:3")
    assert live.promote(spec, tmp_path / "j.sqlite", "s3cret") == "done"
    [(inputs, env)] = seen
    assert inputs.router_token == "s3cret" and inputs.new and env is None  # no environment edit on the way
    assert "s3cret" not in repr(inputs)  # never printed


def test_the_rollouts_entry_point_resolves_the_token_once_and_passes_it_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from qlift.settings import router_token

    rollout_run = importlib.import_module("qlift.rollout.run")  # the module (qlift.rollout.run is its function)

    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", "callers")
    assert router_token("releases") == "releases" and router_token(None) == "callers"
    given: list[str | None] = []
    monkeypatch.setattr(rollout_run, "start", lambda spec, journal, **kw: given.append(kw["router_token"]))
    spec = PromoteOptions().rollout_spec(stable="stable", canary="canary", router="http://127.0.0.1:3")
    rollout_run.run(rollout_run.RolloutInputs(tmp_path / "j.sqlite", router_token="releases"), spec)
    rollout_run.run(rollout_run.RolloutInputs(tmp_path / "j.sqlite"), spec)
    monkeypatch.delenv("QLIFT_ROUTER_TOKEN")
    rollout_run.run(rollout_run.RolloutInputs(tmp_path / "j.sqlite", router_token="releases"), spec)
    assert given == ["releases", "callers", "releases"]
    assert "QLIFT_ROUTER_TOKEN" not in os.environ  # never put where a child process or another thread reads it


def test_nothing_in_the_release_reads_or_edits_the_environment() -> None:
    for path in (REPO / "qlift" / "release").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
                pytest.fail(f"{path.name}:{node.lineno} uses os.{node.attr}: take the value in the live context")


def test_the_release_is_typed_without_any() -> None:
    for path in (REPO / "qlift" / "release").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name | ast.Attribute) and (getattr(node, "id", None) == "Any"
                                                               or getattr(node, "attr", None) == "Any"):
                pytest.fail(f"{path.name}:{node.lineno} is typed Any: name the real type")
            if isinstance(node, ast.ImportFrom) and any(a.name == "Any" for a in node.names):
                pytest.fail(f"{path.name}:{node.lineno} imports Any")
