"""Render a model (and a canary) with a serving recipe into a kustomize directory.

The recipe is resolved as ``qlift serve`` resolves it (overrides, then the model's own
context limit), so a pod runs the engine arguments ``qlift plan`` and ``qlift serve`` show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from qlift.deploy import argo, inference_ext, k8s
from qlift.errors import BadInputError
from qlift.fsutil import atomic_output_dir
from qlift.lineage import utc_now, write_manifest
from qlift.models.modeldir import ModelDir
from qlift.rollout.gateway import render_httproute, validate_httproute
from qlift.rollout.prometheus import label_value
from qlift.rollout.spec import AnalysisSpec, GatewaySpec, RolloutSpec
from qlift.serve.plan import fit_to_model
from qlift.serve.recipes import Recipe, apply_overrides, load_recipe

DEFAULT_IMAGES = {"gpu": "vllm/vllm-openai:v0.26.0", "cpu": "qlift-cpu:latest"}
PROMOTE_SPEC = "promote-rollout.yaml"  # for `qlift promote start -f`; not a cluster object
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")  # 40: the object names add suffixes
_DNS_LABEL_63 = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass
class DeployOptions:
    """What `qlift deploy k8s` renders; every field but model and recipe has a default."""

    model: Path
    recipe: str
    canary: Path | None = None
    rollout: Literal["promote", "argo"] = "promote"
    app: str = "llm"  # object name prefix and app label
    namespace: str = "default"
    public_model: str | None = None  # default: app
    image: str | None = None  # default: per recipe device
    pvc: str = "qlift-models"
    gateway: str = "qlift-gateway"
    gateway_namespace: str | None = None
    replicas: int = 1
    max_replicas: int = 4
    queue_target: int = 4
    prometheus_url: str = "http://prometheus.monitoring.svc:9090"
    sets: list[str] = field(default_factory=list)
    loras: dict[str, Path] = field(default_factory=dict)  # adapters served unmerged on the stable (model) Deployment
    gateway_api: bool = False  # route through an Inference Extension InferencePool (by the body's model)


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


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The image reference grammar of distribution/reference (what the kubelet and registries parse).
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_HOST = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
# a first part is a registry only with a '.' or a port, or as localhost; else it is a (lowercase) path part
_IMAGE_DOMAIN = rf"(?:(?:localhost|{_IMAGE_HOST}(?:\.{_IMAGE_HOST})+)(?::[0-9]+)?|{_IMAGE_HOST}:[0-9]+)"
_IMAGE = re.compile(rf"^(?P<name>(?:{_IMAGE_DOMAIN}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*)"
                    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
INT32_MAX = 2**31 - 1
MAX_GPUS_PER_POD = 64  # the largest nodes hold 8-16 GPUs; a count past this is a typo, not a plan
_LABEL_HELP = "lowercase letters, digits and '-', starting with a letter and ending with a letter or digit"


def _check_names(opts: DeployOptions) -> None:
    """Every value that lands in an object, checked as Kubernetes checks it, before anything is written."""
    for flag, value in (("--name", opts.app), ("--namespace", opts.namespace)):
        if not _DNS_LABEL.match(value):
            raise BadInputError(f"{flag} {value!r} is not a DNS label ({_LABEL_HELP}, at most 40 characters)",
                                field=flag, hint="Example: --name chat.")
    if opts.gateway_namespace is not None and not (_DNS_LABEL.match(opts.gateway_namespace)
                                                   or _DNS_LABEL_63.match(opts.gateway_namespace)):
        raise BadInputError(f"--gateway-namespace {opts.gateway_namespace!r} is not a namespace name (a DNS label: "
                            f"{_LABEL_HELP}, at most 63 characters)", field="--gateway-namespace")
    for flag, value in (("--pvc", opts.pvc), ("--gateway", opts.gateway)):
        if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
            raise BadInputError(f"{flag} {value!r} is not a Kubernetes object name (a DNS-1123 subdomain: lowercase "
                                "letters, digits, '-' and '.', starting and ending with a letter or digit, at most "
                                "253 characters)", field=flag, hint=f"Example: {flag} qlift-models.")
    image = _IMAGE.match(opts.image) if opts.image is not None else None
    if opts.image is not None and (image is None or len(image["name"]) > 255):
        raise BadInputError(f"--image {opts.image!r} is not an image reference ([REGISTRY[:PORT]/]NAME[:TAG][@DIGEST], "
                            "NAME in lowercase)", field="--image", hint="Example: --image registry.local/vllm:v0.26.0.")
    counts: dict[str, int] = {"--replicas": opts.replicas, "--max-replicas": opts.max_replicas,
                              "--queue-target": opts.queue_target}
    for flag, count in counts.items():
        if not 1 <= count <= INT32_MAX:
            raise BadInputError(f"{flag} {count} is out of range (1 to {INT32_MAX}, a Kubernetes int32)", field=flag)
    if opts.max_replicas < opts.replicas:
        raise BadInputError(f"--max-replicas {opts.max_replicas} must be at least --replicas {opts.replicas} (>= 1)",
                            field="--max-replicas")
    if opts.public_model is not None and (not opts.public_model.strip() or not opts.public_model.isprintable()):
        raise BadInputError(f"--public-model {opts.public_model!r} must be a printable, non-empty name",
                            field="--public-model")


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
    weights = sum(p.stat().st_size for p in md.safetensors_files)
    name = md.path.resolve().name
    _check_model_name(role, name)
    return k8s.Version(role=role, model_dir_name=name, served_name=name, public_model=public,
                       engine_args=engine, env=dict(fitted.env), weight_bytes=weights), fitted


def render_k8s(opts: DeployOptions) -> DeployResult:
    """Every object, validated by construction where qlift has the schema (the HTTPRoute)."""
    _check_names(opts)
    recipe = apply_overrides(load_recipe(opts.recipe), opts.sets)
    _check_recipe(recipe)
    public = opts.public_model or opts.app
    stable, fitted = _version("stable", opts.model, recipe, public)
    if opts.gateway_api and (opts.canary is not None or opts.rollout == "argo"):
        raise BadInputError("--gateway-api routes to the model's Deployment by model name; a --canary or an Argo "
                            "rollout splits by Service", field="--gateway-api",
                            hint="Serve the candidate as an adapter (--lora NAME=DIR) with --gateway-api.")
    inference_ext.add_loras(stable, opts.model, opts.loras, cpu=recipe.hardware.device == "cpu")
    canary = _version("canary", opts.canary, recipe, public)[0] if opts.canary is not None else None
    if canary is not None and canary.served_name == stable.served_name:
        raise BadInputError(
            f"stable and canary models are both directories named '{stable.served_name}': their served "
            "names and metrics labels would be the same", field="--canary",
            hint="Give the canary's directory another name (it is the name vLLM serves and labels metrics with).")
    image = opts.image or DEFAULT_IMAGES[recipe.hardware.device]
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
        objects = _argo_objects(opts, fitted, stable, canary, image, gateway)
        promote = None
    else:
        objects = _promote_objects(opts, fitted, versions, image)
        promote = _promote_spec(opts, stable, canary, gateway) if canary is not None else None
    objects["httproute.yaml"] = route = render_httproute(gateway, {next(iter(roles)): 100})
    validate_httproute(route)
    if opts.gateway_api:
        objects.update(inference_ext.gateway_objects(stable, app=app, namespace=ns, public_model=public,
                                                     loras=opts.loras, gateway=opts.gateway,
                                                     gateway_namespace=opts.gateway_namespace))
        validate_httproute(objects["httproute.yaml"])
    objects["prometheus-adapter-rules.yaml"] = k8s.adapter_configmap(app=app, namespace=ns)
    return DeployResult(objects=objects, versions={v.role: v.served_name for v in versions}, recipe=recipe.name,
                        engine_args=stable.engine_args, image=image, promote_spec=promote, recipe_path=recipe.path)


def _promote_objects(opts: DeployOptions, recipe: Recipe, versions: list[k8s.Version],
                     image: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for v in versions:
        name = f"{opts.app}-{v.role}"
        out[f"deployment-{v.role}.yaml"] = k8s.deployment(recipe, v, app=opts.app, namespace=opts.namespace,
                                                          image=image, pvc=opts.pvc, replicas=opts.replicas)
        out[f"service-{v.role}.yaml"] = k8s.service(app=opts.app, role=v.role, namespace=opts.namespace)
        out[f"hpa-{v.role}.yaml"] = k8s.hpa(
            name=name, namespace=opts.namespace, target={"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            min_replicas=opts.replicas, max_replicas=opts.max_replicas, queue_target=opts.queue_target,
            app=opts.app, role=v.role)
    return out


def _argo_objects(opts: DeployOptions, recipe: Recipe, stable: k8s.Version, canary: k8s.Version | None,
                  image: str, gateway: GatewaySpec) -> dict[str, dict[str, Any]]:
    """One Rollout whose template is the version being rolled out (the canary, else the stable);
    Argo keeps the previous template's pods as the stable and moves the route's weights."""
    app, ns = opts.app, opts.namespace
    target = canary or stable
    template = k8s.pod_template(recipe, target, app=app, image=image, pvc=opts.pvc)
    template["metadata"]["labels"].pop("qlift.dev/version")  # one template serves both roles over time
    spec = RolloutSpec.model_fields
    window_s: float = spec["interval"].default
    checks_name = f"{app}-canary-checks"
    labels = k8s.labels(app)
    # The *-model values land inside the queries' model_name="..." matchers: escaped for PromQL.
    args = {"stable": stable.served_name, "canary": target.served_name,
            "stable-model": label_value(stable.served_name), "canary-model": label_value(target.served_name)}
    return {
        "service-stable.yaml": k8s.service(app=app, role="stable", namespace=ns, select_role=False),
        "service-canary.yaml": k8s.service(app=app, role="canary", namespace=ns, select_role=False),
        "analysistemplate.yaml": argo.analysis_template(
            name=checks_name, namespace=ns, labels=labels, prometheus_url=opts.prometheus_url, preset="vllm",
            analysis=AnalysisSpec.model_validate({}), window_s=window_s),
        "rollout.yaml": argo.rollout(
            name=app, namespace=ns, labels=labels, replicas=opts.replicas, template=template,
            steps=list(spec["steps"].default), window_s=window_s, template_name=checks_name, args=args,
            stable_service=f"{app}-stable", canary_service=f"{app}-canary", route=gateway.route_name),
        "hpa.yaml": k8s.hpa(
            name=app, namespace=ns, target={"apiVersion": argo.ROLLOUT_API, "kind": "Rollout", "name": app},
            min_replicas=opts.replicas, max_replicas=opts.max_replicas, queue_target=opts.queue_target,
            app=app, role="rollout"),
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
            header = f"# qlift promote start -f {PROMOTE_SPEC}   (docs/deployment.md)\n"
            (tmp / PROMOTE_SPEC).write_text(header + to_yaml(result.promote_spec),
                                            encoding="utf-8")
        write_manifest(tmp, operation="deploy-k8s", inputs=inputs, started_at=started, parameters={
            "recipe": result.recipe, "rollout": opts.rollout, "app": opts.app, "namespace": opts.namespace,
            "image": result.image, "pvc": opts.pvc, "versions": result.versions, "sets": opts.sets,
            "engine_args": result.engine_args,
        })
    result.out = Path(out)
    return result
