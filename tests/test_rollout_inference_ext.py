"""The Inference Extension data plane: the InferenceModelRewrite's per-model weights, applied with the real
kubernetes client to a fake API server (tests/kube_fake.py) that checks the vendored CRD schema, read back
for drift, and driven through a whole rollout by the controller on a fake clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_fake import FakeKube
from test_rollout_journal import ScriptedEvidence, healthy
from test_rollout_state import FakeClock

from qlift.errors import BadInputError, ExternalToolError
from qlift.rollout.controller import Controller, Pace
from qlift.rollout.dataplane import make_data_plane as make_plane
from qlift.rollout.gateway import crd_schema
from qlift.rollout.inference_ext import GROUP, PLURAL, SCHEMA_FILE, VERSION, validate_rewrite
from qlift.rollout.journal import Journal
from qlift.rollout.spec import build_spec

VENDORED = Path(__file__).parent / "schemas" / "inference-extension" / SCHEMA_FILE.name
SERVER = "http://10.0.0.7:8000"
KEY = (GROUP, PLURAL, "serving", "llm-rewrite")


def spec_data(tmp_path: Path, **section: Any) -> dict[str, Any]:
    return {"stable": "stable", "canary": "canary", "data_plane": "inference-ext", "interval": "30s",
            "analysis": {"min_requests": 5}, "provider": "prometheus", "prometheus": {"url": "http://127.0.0.1:9"},
            "backends": {"stable": f"{SERVER}#smollm2", "canary": f"{SERVER}#tickets"},
            "inference_ext": {"namespace": "serving", "public_model": "llm", **section}}


@pytest.fixture
def kube() -> Any:
    pytest.importorskip("kubernetes", reason="the kubernetes client is the optional 'gateway' extra")
    with FakeKube({(GROUP, VERSION, PLURAL): crd_schema(VENDORED, VERSION)}) as k:
        yield k


def targets(obj: dict[str, Any]) -> list[tuple[str, int]]:
    return [(t["modelRewrite"], t["weight"]) for t in obj["spec"]["rules"][0]["targets"]]


def test_the_packaged_schema_is_the_vendored_crd() -> None:
    assert SCHEMA_FILE.read_bytes() == VENDORED.read_bytes()


def test_set_weights_creates_then_patches_and_reads_back(kube: FakeKube, tmp_path: Path) -> None:
    out = tmp_path / "rewrite.yaml"
    plane = make_plane(build_spec(spec_data(tmp_path, kubeconfig=str(kube.kubeconfig(tmp_path)), output=str(out)), {}),
                       router_token=None)
    assert plane.kind == "inference-ext" and plane.weights() is None  # not created yet

    plane.set_weights({"stable": 90, "canary": 10})
    assert [r[:2] for r in kube.requests[-2:]] == [
        ("PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/serving/{PLURAL}/llm-rewrite"),  # 404: not there yet
        ("POST", f"/apis/{GROUP}/{VERSION}/namespaces/serving/{PLURAL}")]
    obj = kube.get(*KEY)
    assert obj is not None and targets(obj) == [("smollm2", 90), ("tickets", 10)]
    assert obj["spec"]["rules"][0]["matches"] == [{"model": {"type": "Exact", "value": "llm"}}]
    assert obj["spec"]["poolRef"]["name"] == "llm-pool" and obj["metadata"]["generation"] == 1
    assert plane.weights() == {"stable": 90, "canary": 10}

    plane.set_weights({"stable": 0, "canary": 100})
    assert kube.requests[-1][0] == "PATCH" and kube.requests[-1][2] == "application/merge-patch+json"
    obj = kube.get(*KEY)
    assert obj is not None and targets(obj) == [("tickets", 100)] and obj["metadata"]["generation"] == 2
    assert plane.weights() == {"stable": 0, "canary": 100}
    assert yaml.safe_load(out.read_text())["spec"] == obj["spec"]  # the GitOps copy is the same object
    validate_rewrite(yaml.safe_load(out.read_text()))


def test_a_hand_edit_is_seen_as_drift(kube: FakeKube, tmp_path: Path) -> None:
    plane = make_plane(build_spec(spec_data(tmp_path, kubeconfig=str(kube.kubeconfig(tmp_path))), {}),
                       router_token=None)
    plane.set_weights({"stable": 90, "canary": 10})
    rule = kube.get(*KEY)["spec"]["rules"][0]  # type: ignore[index]
    kube.edit(*KEY, {"spec": {"rules": [{**rule, "targets": [{"modelRewrite": "smollm2", "weight": 3},
                                                               {"modelRewrite": "tickets", "weight": 1}]}]}})
    assert plane.weights() == {"stable": 75, "canary": 25}  # weights are relative
    kube.edit(*KEY, {"spec": {"rules": [{**rule, "targets": [{"modelRewrite": "other", "weight": 1}]}]}})
    assert plane.weights() == {"stable": 0, "canary": 0, "other": 100}


def test_the_server_refusing_is_one_error(kube: FakeKube, tmp_path: Path) -> None:
    bad = make_plane(build_spec(spec_data(tmp_path, kubeconfig=str(kube.kubeconfig(tmp_path, token="wrong"))), {}),
                     router_token=None)
    assert bad.weights() is None
    with pytest.raises(ExternalToolError, match="InferenceModelRewrite serving/llm-rewrite failed: 401"):
        bad.set_weights({"stable": 90, "canary": 10})
    assert kube.get(*KEY) is None


@pytest.mark.parametrize(("path", "value", "where"), [
    (("spec", "rules", 0, "targets", 0, "weight"), 0, "weight"),
    (("spec", "rules", 0, "matches", 0, "model", "type"), "Prefix", "type"),
    (("spec", "poolRef", "name"), "", "name"),
])
def test_schema_catches_bad_renderings(tmp_path: Path, path: tuple[Any, ...], value: Any, where: str) -> None:
    from qlift.rollout.inference_ext import render_rewrite

    sp = build_spec(spec_data(tmp_path, output=str(tmp_path / "r.yaml")), {})
    assert sp.inference_ext is not None
    obj = render_rewrite(sp.inference_ext, {"stable": "smollm2", "canary": "tickets"}, {"stable": 50, "canary": 50})
    validate_rewrite(obj)
    node: Any = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(BadInputError, match=where):
        validate_rewrite(obj)


def test_spec_errors_name_the_file_and_field(tmp_path: Path) -> None:
    data = spec_data(tmp_path, output=str(tmp_path / "r.yaml"))
    for broken, message in [
        ({**data, "inference_ext": None}, "needs an inference_ext: section"),
        ({**data, "inference_ext": {"namespace": "serving"}}, "inference_ext.kubeconfig or inference_ext.output"),
        ({**data, "backends": {"stable": SERVER, "canary": SERVER}, "models": {"stable": "m", "canary": "m"}},
         "both rewrite to model 'm'"),
    ]:
        with pytest.raises(BadInputError, match=message) as e:
            build_spec(broken, {}, path=Path("rollout.yaml"))
        assert "rollout.yaml" in e.value.one_line()
    with pytest.raises(BadInputError) as e:
        build_spec({**data, "inference_ext": {**data["inference_ext"], "rewrite": "x"}}, {}, path=Path("r.yaml"))
    assert "inference_ext.rewrite" in e.value.one_line()


def test_model_names_default_to_the_backends_models_then_the_versions(tmp_path: Path) -> None:
    sp = build_spec({**spec_data(tmp_path, output=str(tmp_path / "r.yaml")),
                     "backends": {"stable": f"{SERVER}#smollm2", "canary": SERVER}}, {})
    assert (sp.served_model("stable"), sp.served_model("canary")) == ("smollm2", "canary")
    data = sp.model_dump(mode="json")
    sp = build_spec({**data, "models": {"canary": "tickets"},
                     "inference_ext": {**data["inference_ext"], "models": {"stable": "base"}}}, {})
    assert (sp.served_model("stable"), sp.served_model("canary")) == ("base", "tickets")


def test_a_rollout_on_the_rewrite_ends_promoted_at_canary_100(kube: FakeKube, tmp_path: Path) -> None:
    sp = build_spec(spec_data(tmp_path, kubeconfig=str(kube.kubeconfig(tmp_path))), {})
    plane = make_plane(sp, router_token=None)
    journal = Journal(tmp_path / "j.sqlite")
    r = journal.create(sp.model_dump(mode="json"), sp.stable, sp.canary)
    clock = FakeClock()
    seen: list[list[tuple[str, int]]] = []

    def sleep(s: float) -> None:  # a hand edit in the first window: the controller puts the step back
        clock.sleep(s)
        obj = kube.get(*KEY)
        if obj is not None and (not seen or seen[-1] != targets(obj)):
            seen.append(targets(obj))
        if seen == [[("smollm2", 90), ("tickets", 10)]]:
            kube.edit(*KEY, {"spec": {"rules": [{**obj["spec"]["rules"][0],  # type: ignore[index]
                                                 "targets": [{"modelRewrite": "smollm2", "weight": 100}]}]}})

    ctl = Controller(journal, r.id, sp, plane, ScriptedEvidence([(healthy("canary", 20), healthy("stable", 80))]),  # type: ignore[arg-type]
                     pace=Pace(tick=0.25, sleep=sleep, clock=clock.time))
    final = ctl.run()
    assert final.state == "promoted"
    obj = kube.get(*KEY)
    assert obj is not None and targets(obj) == [("tickets", 100)]
    assert seen[:3] == [[("smollm2", 90), ("tickets", 10)], [("smollm2", 100)], [("smollm2", 90), ("tickets", 10)]]
    assert ctl.drifts == 1 and [e["kind"] for e in journal.history(r.id)["events"]].count("drift") == 1
    journal.close()
