"""qlift deploy k8s: every rendered object validated against its vendored JSON schema
(Kubernetes 1.37 strict schemas, the Gateway API HTTPRoute CRD, Argo Rollouts CRDs where
vendored), kustomize and promtool on the output where installed, and the CLI's errors."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from string import Template
from typing import Any

import jsonschema
import pytest
import yaml
from referencing import Registry, Resource

from qlift.deploy import DeployOptions, render_k8s
from qlift.deploy.argo import checks
from qlift.rollout.gateway import httproute_schema
from qlift.rollout.prometheus import PRESETS
from qlift.rollout.spec import AnalysisSpec, build_spec

SCHEMAS = Path(__file__).parent / "schemas"
K8S_SCHEMAS = {
    ("apps/v1", "Deployment"): "deployment-apps-v1.json",
    ("v1", "Service"): "service-v1.json",
    ("v1", "ConfigMap"): "configmap-v1.json",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "horizontalpodautoscaler-autoscaling-v2.json",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudget-policy-v1.json",
    ("v1", "ServiceAccount"): "serviceaccount-v1.json",
    ("rbac.authorization.k8s.io/v1", "Role"): "role-rbac-v1.json",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebinding-rbac-v1.json",
}
ARGO_CRDS = {"Rollout": "rollout-crd.yaml", "AnalysisTemplate": "analysis-template-crd.yaml"}


@functools.cache
def _k8s_registry() -> Registry:
    defs = json.loads((SCHEMAS / "k8s" / "_definitions.json").read_text())
    return Registry().with_resource(defs["$id"], Resource.from_contents(defs))


@functools.cache
def _argo_schema(kind: str) -> dict[str, Any] | None:
    path = SCHEMAS / "argo" / ARGO_CRDS[kind]
    if not path.is_file():
        return None
    crd = yaml.safe_load(path.read_text())
    return next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")


def validate(obj: dict[str, Any]) -> str:
    """Validate against the vendored schema for the object's kind; returns which schema was used."""
    key = (obj["apiVersion"], obj["kind"])
    if key in K8S_SCHEMAS:
        schema = json.loads((SCHEMAS / "k8s" / K8S_SCHEMAS[key]).read_text())
        jsonschema.Draft202012Validator(schema, registry=_k8s_registry()).validate(obj)
        return K8S_SCHEMAS[key]
    if obj["kind"] == "HTTPRoute":
        jsonschema.Draft7Validator(httproute_schema()).validate(obj)
        return "httproute-crd"
    if obj["kind"] in ARGO_CRDS:
        schema = _argo_schema(obj["kind"])
        if schema is None:
            pytest.skip(f"Argo Rollouts CRD not vendored: tests/schemas/argo/{ARGO_CRDS[obj['kind']]} "
                        "(tests/schemas/argo/README.md)")
        jsonschema.Draft7Validator(schema).validate(obj)
        return ARGO_CRDS[obj["kind"]]
    raise AssertionError(f"no schema for {key}")


def _model(root: Path, name: str, max_position: int = 8192) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
        "max_position_embeddings": max_position, "torch_dtype": "bfloat16"}))
    save_file({"model.embed_tokens.weight": np.zeros((256, 64), dtype=np.float16)}, str(d / "model.safetensors"))
    return d


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, Path]:
    return _model(tmp_path, "chat-v1"), _model(tmp_path, "chat-v2")


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("recipe", ["chat-h100", "multi-tenant-a100x2", "cpu"])
@pytest.mark.parametrize("rollout", ["promote", "argo"])
def test_every_rendered_object_matches_its_schema(models, recipe: str, rollout: str) -> None:
    stable, canary = models
    result = render_k8s(DeployOptions(model=stable, recipe=recipe, canary=canary, rollout=rollout))  # type: ignore[arg-type]
    kinds = sorted(o["kind"] for o in result.objects.values())
    expected = ["ConfigMap", "HTTPRoute", "HorizontalPodAutoscaler", "Service", "Service"]
    expected += ["AnalysisTemplate", "Rollout"] if rollout == "argo" else ["Deployment", "Deployment",
                                                                           "HorizontalPodAutoscaler"]
    assert kinds == sorted(expected)
    for obj in result.objects.values():
        if obj["kind"] not in ARGO_CRDS:
            validate(obj)
    for obj in result.objects.values():  # last: may skip when the Argo CRDs are not vendored
        if obj["kind"] in ARGO_CRDS:
            validate(obj)


def test_a_broken_object_is_caught_by_the_schemas(models) -> None:
    """The validation has teeth: strict schemas refuse unknown fields and wrong types."""
    objs = render_k8s(DeployOptions(model=models[0], recipe="chat-h100")).objects
    dep = json.loads(json.dumps(objs["deployment-stable.yaml"]))
    _container(dep)["resource"] = _container(dep).pop("resources")  # a typo
    with pytest.raises(jsonschema.ValidationError):
        validate(dep)
    hpa = json.loads(json.dumps(objs["hpa-stable.yaml"]))
    hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] = {"bad": 1}
    with pytest.raises(jsonschema.ValidationError):
        validate(hpa)


def test_deployment_runs_the_recipes_engine_arguments(models) -> None:
    from qlift.serve.recipes import load_recipe

    stable, canary = models
    objs = render_k8s(DeployOptions(model=stable, recipe="multi-tenant-a100x2", canary=canary)).objects
    c = _container(objs["deployment-canary.yaml"])
    assert c["command"] == ["vllm", "serve"]
    args = c["args"]
    assert args[args.index("--model") + 1] == "/models/chat-v2"
    i = args.index("--served-model-name")
    assert args[i + 1:i + 3] == ["chat-v2", "llm"]  # own name first: vLLM labels metrics with it
    engine = load_recipe("multi-tenant-a100x2").engine.args()
    assert args[args.index("--tensor-parallel-size") + 1] == str(engine["tensor_parallel_size"])
    assert args[args.index("--max-model-len") + 1] == "8192"  # lowered to the model's context, as serve does
    assert "--enable-prefix-caching" in args
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    volumes = objs["deployment-canary.yaml"]["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["persistentVolumeClaim"] == {"claimName": "qlift-models", "readOnly": True}


def test_false_engine_argument_becomes_no_flag_and_cpu_has_no_gpu(models) -> None:
    objs = render_k8s(DeployOptions(model=models[0], recipe="cpu", sets=["enable_prefix_caching=false"])).objects
    c = _container(objs["deployment-stable.yaml"])
    assert "--no-enable-prefix-caching" in c["args"] and "--enforce-eager" in c["args"]
    assert "nvidia.com/gpu" not in c["resources"]["requests"]
    assert c["image"] == "qlift-cpu:latest"


def test_hpa_scales_on_vllm_queue_depth_through_prometheus_adapter(models) -> None:
    objs = render_k8s(DeployOptions(model=models[0], recipe="chat-h100", queue_target=3, max_replicas=6)).objects
    spec = objs["hpa-stable.yaml"]["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm-stable"}
    assert spec["maxReplicas"] == 6
    assert spec["metrics"] == [{"type": "Pods", "pods": {"metric": {"name": "vllm_num_requests_waiting"},
                                                         "target": {"type": "AverageValue", "averageValue": "3"}}}]
    rules = yaml.safe_load(objs["prometheus-adapter-rules.yaml"]["data"]["config.yaml"])["rules"]
    assert rules[0]["seriesQuery"].startswith("vllm:num_requests_waiting{")
    assert rules[0]["name"] == {"matches": "^vllm:num_requests_waiting$", "as": "vllm_num_requests_waiting"}


def test_httproute_and_promote_spec_drive_the_two_services(models) -> None:
    result = render_k8s(DeployOptions(model=models[0], recipe="chat-h100", canary=models[1], namespace="serving"))
    refs = result.objects["httproute.yaml"]["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [("llm-stable", 100), ("llm-canary", 0)]
    assert result.promote_spec is not None
    spec = build_spec(result.promote_spec, {})  # exactly what `qlift promote start -f` validates
    assert (spec.stable, spec.canary, spec.data_plane) == ("chat-v1", "chat-v2", "gateway-api")
    assert spec.gateway is not None and spec.gateway.backends["chat-v2"].name == "llm-canary"
    assert spec.prometheus is not None and spec.prometheus.preset == "vllm"


def test_argo_analysis_uses_promotes_queries_and_limits() -> None:
    a = AnalysisSpec()
    got = {c.name: c for c in checks("vllm", a, 30)}
    assert list(got) == ["canary-requests", "latency-ratio", "ttft-ratio", "finish-length-share-ratio",
                         "completion-tokens-ratio"]  # the vllm preset has no HTTP errors: promote skips it too
    bound = Template(PRESETS["vllm"]["ttft_p50"]).safe_substitute(model="{{args.canary-model}}", window="30s")
    assert bound in got["ttft-ratio"].query
    assert got["latency-ratio"].success.endswith(f"<= {a.max_latency_ratio}")
    assert f"> bool {a.min_latency_increase_s}" in got["latency-ratio"].query
    router = {c.name: c for c in checks("router", a, 60)}
    assert f"<= {a.max_error_rate}" in router["error-rate"].success
    errors = Template(PRESETS["router"]["errors"]).safe_substitute(backend="{{args.canary}}", window="60s")
    assert errors in router["error-rate"].query
    assert "empty-share-ratio" in router


def test_argo_metrics_hold_on_no_data_like_promote(models) -> None:
    """Argo ends a metric Successful once its count is reached whatever was inconclusive, so a
    single measurement without data would pass: each metric is measured once per window instead,
    succeeding on the first pass, failing on the first failure, inconclusive after max_inconclusive."""
    a = AnalysisSpec()
    objs = render_k8s(DeployOptions(model=models[0], recipe="chat-h100", canary=models[1], rollout="argo")).objects
    for metric in objs["analysistemplate.yaml"]["spec"]["metrics"]:
        assert metric["interval"] == "30s"
        assert metric["consecutiveSuccessLimit"] == a.intervals_per_step
        assert metric["count"] == a.max_inconclusive + a.intervals_per_step
        assert (metric["failureLimit"], metric["inconclusiveLimit"]) == (0, a.max_inconclusive)
        assert metric["consecutiveErrorLimit"] == a.max_inconclusive  # promote's default, not Argo's 4


def test_argo_rollout_steps_and_route(models) -> None:
    objs = render_k8s(DeployOptions(model=models[0], recipe="chat-h100", canary=models[1], rollout="argo")).objects
    canary = objs["rollout.yaml"]["spec"]["strategy"]["canary"]
    assert [s["setWeight"] for s in canary["steps"] if "setWeight" in s] == [10, 50, 100]
    kinds = [next(iter(s)) for s in canary["steps"]]
    assert kinds == ["setWeight", "pause", "analysis"] * 2 + ["setWeight"]
    args = {a["name"]: a["value"] for a in canary["steps"][2]["analysis"]["args"]}
    assert args == {"stable": "chat-v1", "canary": "chat-v2", "stable-model": "chat-v1", "canary-model": "chat-v2"}
    assert canary["trafficRouting"]["plugins"]["argoproj-labs/gatewayAPI"]["httpRoute"] == "llm"
    assert _container(objs["rollout.yaml"])["args"][1] == "/models/chat-v2"  # the template is the new version
    assert objs["hpa.yaml"]["spec"]["scaleTargetRef"]["kind"] == "Rollout"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) not installed")
def test_every_analysis_query_parses_in_promtool(tmp_path: Path) -> None:
    rules = []
    for preset in PRESETS:
        for c in checks(preset, AnalysisSpec(), 30):
            expr = c.query.replace("{{args.", "").replace("}}", "")  # an AnalysisRun fills these in
            rules.append({"record": f"qlift:{preset}:{c.name.replace('-', '_')}", "expr": expr})
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "qlift", "rules": rules}]}))
    out = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


def test_cli_writes_kustomize_dir_with_lineage(run_cli, models, tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    r = run_cli("deploy", "k8s", models[0], "--recipe", "chat-h100", "--canary", models[1], "-o", out, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["versions"] == {"stable": "chat-v1", "canary": "chat-v2"}
    kust = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(o["file"] for o in data["objects"])
    for f in kust["resources"]:
        validate(yaml.safe_load((out / f).read_text()))
    manifest = json.loads((out / "qlift.json").read_text())
    assert manifest["operation"] == "deploy-k8s"
    assert {i["role"] for i in manifest["inputs"]} == {"model", "canary", "recipe"}
    assert "promote-rollout.yaml" in manifest["outputs"]
    again = run_cli("deploy", "k8s", models[0], "--recipe", "chat-h100", "-o", out)
    assert again.exit_code == 3 and "--force" in again.stderr
    assert (out / "deployment-canary.yaml").exists()  # untouched
    forced = run_cli("deploy", "k8s", models[0], "--recipe", "chat-h100", "-o", out, "--force")
    assert forced.exit_code == 0 and not (out / "deployment-canary.yaml").exists()
    if shutil.which("kubectl"):  # kustomize builds the directory as `kubectl apply -k` would
        built = subprocess.run(["kubectl", "kustomize", str(out)], capture_output=True, text=True, timeout=60)
        assert built.returncode == 0, built.stderr
        assert sorted(d["kind"] for d in yaml.safe_load_all(built.stdout)) == sorted(
            o["kind"] for o in (yaml.safe_load((out / f).read_text()) for f in
                                yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]))


@pytest.mark.parametrize(("args", "needle"), [
    (["--name", "Bad_Name"], "--name"),
    (["--max-replicas", "0"], "--max-replicas"),
    (["--recipe", "no-such-recipe"], "no recipe named"),
    (["--set", "max_model_len=banana"], "--set"),
    (["--max-replicas", str(2**31)], "--max-replicas"),
    (["--replicas", str(2**40), "--max-replicas", str(2**41)], "--replicas"),
    (["--queue-target", str(2**31)], "--queue-target"),
    (["--pvc", "bad pvc/../x"], "--pvc"),
    (["--pvc", "-models"], "--pvc"),
    (["--gateway", "Bad Gateway!"], "--gateway"),
    (["--gateway-namespace", "Not_A_Namespace"], "--gateway-namespace"),
    (["--image", "vllm/vllm openai:latest"], "--image"),
    (["--image", "Vllm/x"], "--image"),
    (["--image", "vllm:tag:again"], "--image"),
    (["--namespace", "a" * 64], "--namespace"),
    (["--public-model", "line\nbreak"], "--public-model"),
])
def test_bad_input_is_one_line(run_cli, models, tmp_path: Path, args: list[str], needle: str) -> None:
    base = ["deploy", "k8s", models[0], "-o", tmp_path / "o"]
    if "--recipe" not in args:
        base += ["--recipe", "chat-h100"]
    r = run_cli(*base, *args)
    assert r.exit_code in (2, 4), r.output
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_canary_with_the_same_directory_name_is_refused(run_cli, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, two = _model(tmp_path / "a", "chat"), _model(tmp_path / "b", "chat")
    r = run_cli("deploy", "k8s", one, "--recipe", "chat-h100", "--canary", two, "-o", tmp_path / "o")
    assert r.exit_code == 2 and "--canary" in r.stderr


def test_a_recipe_with_an_absurd_gpu_count_is_refused(run_cli, models, tmp_path: Path) -> None:
    recipe = yaml.safe_load((Path(__file__).parent.parent / "recipes" / "chat-h100.yaml").read_text())
    recipe["hardware"]["gpu_count"] = 100000
    recipe["name"] = "huge"
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(recipe))
    r = run_cli("deploy", "k8s", models[0], "--recipe", path, "-o", tmp_path / "o")
    assert r.exit_code == 2 and "hardware.gpu_count" in r.stderr and "100000" in r.stderr, r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("rollout", ["promote", "argo"])
@pytest.mark.parametrize("recipe", ["chat-h100", "cpu"])
def test_written_yaml_passes_yamllint_default_profile(run_cli, models, tmp_path: Path, rollout: str,
                                                     recipe: str) -> None:
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    out = tmp_path / "k8s"
    r = run_cli("deploy", "k8s", models[0], "--recipe", recipe, "--canary", models[1], "--rollout", rollout, "-o", out)
    assert r.exit_code == 0, r.output
    conf = YamlLintConfig("extends: default")
    files = sorted(out.glob("*.yaml"))
    assert len(files) >= 6
    problems = [f"{f.name}:{p.line}: {p.desc} ({p.rule})" for f in files for p in linter.run(f.read_text(), conf)]
    assert problems == []
    for f in files:  # still one document each, read back as rendered
        assert len(list(yaml.safe_load_all(f.read_text()))) == 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) not installed")
def test_a_model_dir_named_with_a_quote_keeps_the_promql_valid(tmp_path: Path) -> None:
    stable, canary = _model(tmp_path, "chat-v1"), _model(tmp_path, 'chat"v2\\x')
    objs = render_k8s(DeployOptions(model=stable, recipe="chat-h100", canary=canary, rollout="argo")).objects
    steps = objs["rollout.yaml"]["spec"]["strategy"]["canary"]["steps"]
    args = {a["name"]: a["value"] for a in steps[2]["analysis"]["args"]}
    assert args["canary"] == 'chat"v2\\x' and args["canary-model"] == 'chat\\"v2\\\\x'
    rules = []
    for i, metric in enumerate(objs["analysistemplate.yaml"]["spec"]["metrics"]):
        expr = metric["provider"]["prometheus"]["query"]
        for name, value in args.items():  # what an AnalysisRun does with its arguments
            expr = expr.replace(f"{{{{args.{name}}}}}", value)
        rules.append({"record": f"qlift:check_{i}", "expr": expr})
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "qlift", "rules": rules}]}))
    out = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_recipe_file_inside_the_output_is_never_replaced(run_cli, models, tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    out.mkdir()
    recipe = out / "mine.yaml"
    data = yaml.safe_load((Path(__file__).parent.parent / "recipes" / "cpu.yaml").read_text())
    data["name"] = "mine"
    recipe.write_text(yaml.safe_dump(data))
    r = run_cli("deploy", "k8s", models[0], "--recipe", recipe, "-o", out, "--force")
    assert r.exit_code == 2 and "input" in r.stderr, r.output
    assert recipe.exists()
