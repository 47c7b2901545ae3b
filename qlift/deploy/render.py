"""Render a model (and a canary) with a serving recipe into a kustomize directory.

The recipe is resolved as ``qlift serve`` resolves it (overrides, then the model's own
context limit), so a pod runs the engine arguments ``qlift plan`` and ``qlift serve`` show.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from qlift.deploy import argo, fleet, inference_ext, k8s
from qlift.deploy.options import DeployOptions
from qlift.errors import BadInputError
from qlift.fsutil import atomic_output_dir
from qlift.lineage import utc_now, write_manifest
from qlift.models.modeldir import ModelDir
from qlift.rollout.gateway import render_httproute, validate_httproute
from qlift.rollout.prometheus import label_value
from qlift.rollout.spec import AnalysisSpec, GatewaySpec, RolloutSpec
from qlift.serve.plan import fit_to_model
from qlift.serve.recipes import Recipe, apply_overrides, load_recipe

PROMOTE_SPEC = "promote-rollout.yaml"  # for `qlift promote start -f`; not a cluster object
MAX_GPUS_PER_POD = 64  # the largest nodes hold 8-16 GPUs; a count past this is a typo, not a plan


@dataclass
class DeployResult:
    objects: dict[str, dict[str, Any]]  # file name -> Kubernetes object, in apply order
    versions: dict[str, str]  # role -> served model name
    recipe: str
    engine_args: dict[str, Any]
    image: str
    promote_spec: dict[str, Any] | None = None
    recipe_path: Path | None = None
    out: Path | None = None

    @property
    def promote_file(self) -> str:
        return PROMOTE_SPEC


def _check_recipe(recipe: Recipe) -> None:
    gpus = recipe.hardware.gpu_count
    if recipe.hardware.device == "gpu" and not 1 <= gpus <= MAX_GPUS_PER_POD:
        raise BadInputError(f"gpu_count {gpus} is not a GPU count one pod can have (1 to {MAX_GPUS_PER_POD})",
                            path=recipe.path or recipe.name, field="hardware.gpu_count",
                            hint="Fix the recipe's hardware.gpu_count.")


def _check_model_name(role: str, name: str) -> None:
    """The model directory's name is vLLM's served name and its metrics' model_name label."""
    if not name.isprintable() or name != name.strip():
        raise BadInputError(f"the {role} model directory name {name!r} has control characters or edge spaces; it "
                            "becomes vLLM's served name and the model_name label of its metrics",
                            field="--canary" if role == "canary" else "MODEL", hint="Rename the directory.")


def _version(role: str, path: Path, recipe: Recipe, public: str) -> tuple[k8s.Version, Recipe]:
    md = ModelDir.open(path)
    md.require_weights()
    fitted, _notes = fit_to_model(recipe, md)
    engine = fitted.engine.args()
    # As `qlift serve --drain` does: on SIGTERM (a rollout, a scale-down) vLLM lets in-flight requests finish; a
    # recipe's or --set shutdown_timeout wins. The pod's grace period is made from it (k8s.grace_seconds).
    engine.setdefault("shutdown_timeout", k8s.DRAIN_S)
    weights = sum(p.stat().st_size for p in md.safetensors_files)
    name = md.path.resolve().name
    _check_model_name(role, name)
    return k8s.Version(role=role, model_dir_name=name, served_name=name, public_model=public,
                       engine_args=engine, env=dict(fitted.env), weight_bytes=weights), fitted


def render_k8s(opts: DeployOptions) -> DeployResult:
    """Every object, validated by construction where qlift has the schema (the HTTPRoute); the options
    checked themselves when they were made."""
    recipe = apply_overrides(load_recipe(opts.recipe), list(opts.sets))
    _check_recipe(recipe)
    public = opts.served_as
    stable, fitted = _version("stable", opts.model, recipe, public)
    inference_ext.add_loras(stable, opts.model, opts.loras, cpu=recipe.hardware.device == "cpu")
    canary = _version("canary", opts.canary, recipe, public)[0] if opts.canary is not None else None
    if canary is not None and canary.served_name == stable.served_name:
        raise BadInputError(
            f"stable and canary models are both directories named '{stable.served_name}': their served "
            "names and metrics labels would be the same", field="--canary",
            hint="Give the canary's directory another name (it is the name vLLM serves and labels metrics with).")
    image = opts.image_for(recipe.hardware.device)
    app, ns = opts.app, opts.namespace
    versions = [v for v in (stable, canary) if v is not None]
    # Argo moves the weights between its two Services, so the route names both from the start.
    roles = {"stable": "stable", "canary": "canary"} if opts.rollout == "argo" else \
        {v.served_name: v.role for v in versions}
    gateway = GatewaySpec.model_validate({
        "route_name": app, "namespace": ns,
        "parent_refs": [{"name": opts.gateway, "namespace": opts.gateway_namespace}],
        "backends": {key: {"name": f"{app}-{role}", "port": k8s.PORT} for key, role in roles.items()}})
    if opts.rollout == "argo":
        objects = _argo_objects(opts, fitted, stable, canary)
        promote = None
    elif opts.fleet:  # the qlift routers split the traffic: no route for a gateway to re-weight
        objects = _promote_objects(opts, fitted, versions) | fleet.objects(opts, versions)
        promote = fleet.promote_spec(opts, stable, canary) if canary is not None else None
    else:
        objects = _promote_objects(opts, fitted, versions)
        promote = _promote_spec(opts, stable, canary, gateway) if canary is not None else None
    if not opts.fleet:
        objects["httproute.yaml"] = route = render_httproute(gateway, {next(iter(roles)): 100})
        validate_httproute(route)
    if opts.gateway_api:
        objects.update(inference_ext.objects(opts, stable))
        validate_httproute(objects["httproute.yaml"])
    objects["prometheus-adapter-rules.yaml"] = k8s.adapter_configmap(app=app, namespace=ns)
    return DeployResult(objects=objects, versions={v.role: v.served_name for v in versions}, recipe=recipe.name,
                        engine_args=stable.engine_args, image=image, promote_spec=promote, recipe_path=recipe.path)


def _promote_objects(opts: DeployOptions, recipe: Recipe, versions: list[k8s.Version]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for v in versions:
        name = f"{opts.app}-{v.role}"
        out[f"deployment-{v.role}.yaml"] = k8s.deployment(recipe, v, opts)
        out[f"service-{v.role}.yaml"] = k8s.service(app=opts.app, role=v.role, namespace=opts.namespace)
        out[f"hpa-{v.role}.yaml"] = k8s.hpa(opts, {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                                            role=v.role)
    return out


def _argo_objects(opts: DeployOptions, recipe: Recipe, stable: k8s.Version,
                  canary: k8s.Version | None) -> dict[str, dict[str, Any]]:
    """One Rollout whose template is the version being rolled out (the canary, else the stable);
    Argo keeps the previous template's pods as the stable and moves the route's weights."""
    app, ns = opts.app, opts.namespace
    target = canary or stable
    template = k8s.pod_template(recipe, target, app=app, image=opts.image_for(recipe.hardware.device), pvc=opts.pvc)
    template["metadata"]["labels"].pop("qlift.dev/version")  # one template serves both roles over time
    spec = RolloutSpec.model_fields
    window_s: float = spec["interval"].default
    # The *-model values land inside the queries' model_name="..." matchers: escaped for PromQL.
    args = {"stable": stable.served_name, "canary": target.served_name,
            "stable-model": label_value(stable.served_name), "canary-model": label_value(target.served_name)}
    return {
        "service-stable.yaml": k8s.service(app=app, role="stable", namespace=ns, select_role=False),
        "service-canary.yaml": k8s.service(app=app, role="canary", namespace=ns, select_role=False),
        "analysistemplate.yaml": argo.analysis_template(opts, AnalysisSpec.model_validate({}), window_s=window_s),
        "rollout.yaml": argo.rollout(opts, template, args, steps=list(spec["steps"].default), window_s=window_s),
        "hpa.yaml": k8s.hpa(opts, {"apiVersion": argo.ROLLOUT_API, "kind": "Rollout", "name": app}, role="rollout"),
    }


def _promote_spec(opts: DeployOptions, stable: k8s.Version, canary: k8s.Version,
                  gateway: GatewaySpec) -> dict[str, Any]:
    """`qlift promote start -f` input: the gateway-api data plane on this route, judged on vLLM's
    series in the cluster's Prometheus (the pods are not reachable from outside for /metrics)."""
    data = {
        "stable": stable.served_name,
        "canary": canary.served_name,
        "data_plane": "gateway-api",
        "provider": "prometheus",
        "prometheus": {"url": opts.prometheus_url, "preset": "vllm"},
        "models": {stable.served_name: stable.served_name, canary.served_name: canary.served_name},
        "vllm_metrics": False,
        "gateway": {**gateway.model_dump(mode="json", exclude_none=True, exclude={"output", "kubeconfig"}),
                    "kubeconfig": "~/.kube/config"},
    }
    RolloutSpec.model_validate(data)  # what promote will read back
    return data


class _PlainDumper(yaml.SafeDumper):
    """No anchors or aliases: manifests are read by people and by tools that mishandle them.
    Lists are indented under their key, as kubectl's own output and yamllint's default profile expect."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    """Multi-line strings (a ConfigMap's file) as literal blocks, as people write them."""
    if "\n" in data.rstrip("\n"):
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_PlainDumper.add_representer(str, _str)


LONG_LINES = "# yamllint disable rule:line-length\n# (PromQL stays on one line: it pastes into Prometheus as it is)\n"


def to_yaml(obj: Any) -> str:
    """One YAML document with its ``---`` start that passes yamllint's default profile. Strings are
    never folded; a document with a line past yamllint's 80 columns (the AnalysisTemplate's PromQL)
    says so in a yamllint directive at its top."""
    text = yaml.dump(obj, Dumper=_PlainDumper, sort_keys=False, explicit_start=True, width=1 << 16)
    return LONG_LINES + text if any(len(line) > 80 for line in text.splitlines()) else text


def _kustomization(files: list[str], namespace: str) -> dict[str, Any]:
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "namespace": namespace, "resources": files}


def write_k8s(opts: DeployOptions, out: Path, *, force: bool = False) -> DeployResult:
    """Render, then write one YAML file per object, kustomization.yaml and qlift.json atomically."""
    started = utc_now()
    result = render_k8s(opts)
    models = {"model": opts.model} | ({"canary": opts.canary} if opts.canary is not None else {})
    models |= {f"adapter:{name}": path for name, path in opts.loras.items()}
    inputs = models | ({"recipe": result.recipe_path} if result.recipe_path is not None else {})
    with atomic_output_dir(out, force=force, inputs=list(inputs.values())) as tmp:  # the recipe file too
        for name, obj in result.objects.items():
            (tmp / name).write_text(to_yaml(obj), encoding="utf-8")
        kustomization = _kustomization(list(result.objects), opts.namespace)
        (tmp / "kustomization.yaml").write_text(to_yaml(kustomization), encoding="utf-8")
        if result.promote_spec is not None:
            header = f"# qlift promote start -f {result.promote_file}   (docs/deployment.md)\n"
            if opts.fleet:  # it discovers the routers through the Kubernetes API: a pod needs this account
                account = fleet.promote_account(opts.app)
                header += f"# in the cluster, as ServiceAccount {account} (it may list EndpointSlices)\n"
            (tmp / result.promote_file).write_text(header + to_yaml(result.promote_spec), encoding="utf-8")
        write_manifest(tmp, operation="deploy-k8s", inputs=inputs, started_at=started, parameters={
            "recipe": result.recipe, "rollout": opts.rollout, "data_plane": opts.data_plane, "app": opts.app,
            "namespace": opts.namespace,
            "image": result.image, "pvc": opts.pvc, "versions": result.versions, "sets": list(opts.sets),
            "engine_args": result.engine_args,
        })
    result.out = Path(out)
    return result
