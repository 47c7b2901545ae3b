"""What ``qlift deploy k8s`` renders: the one definition ``render_k8s`` takes and the command's options
are generated from (all but MODEL and --lora, which the command spells its own way). Every value that
lands in an object is checked here as Kubernetes checks it, before anything is read or written."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from qlift.errors import BadInputError
from qlift.options import Range, check_fields

INT32_MAX = 2**31 - 1
DEFAULT_IMAGES = {"gpu": "vllm/vllm-openai:v0.26.0", "cpu": "qlift-cpu:latest"}
ROUTER_IMAGE = "qlift:latest"  # docker/Dockerfile: `qlift` is its entrypoint
VLLM_ROUTER_IMAGE = "vllm/vllm-router:v0.1.17"  # vllm-project/router's release image
# vllm-router policies its release binary and its PyPI launcher both take
PoolPolicy = Literal["cache_aware", "power_of_two", "consistent_hash", "round_robin", "random"]
Count = Annotated[int, Range(ge=1, le=INT32_MAX)]  # a Kubernetes int32 count
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")  # 40: the object names add suffixes
_DNS_LABEL_63 = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The image reference grammar of distribution/reference (what the kubelet and registries parse).
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_HOST = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
# a first part is a registry only with a '.' or a port, or as localhost; else it is a (lowercase) path part
_IMAGE_DOMAIN = rf"(?:(?:localhost|{_IMAGE_HOST}(?:\.{_IMAGE_HOST})+)(?::[0-9]+)?|{_IMAGE_HOST}:[0-9]+)"
_IMAGE = re.compile(rf"^(?P<name>(?:{_IMAGE_DOMAIN}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*)"
                    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
_LABEL_HELP = "lowercase letters, digits and '-', starting with a letter and ending with a letter or digit"


def existing_dir(text: str) -> Path:
    """``--canary DIR``: a directory that exists."""
    path = Path(text)
    if not path.is_dir():
        raise BadInputError(f"directory {text!r} does not exist", field="canary",
                            hint="Pass the canary's model directory.")
    return path


@dataclass(frozen=True)
class DeployOptions:
    model: Path
    """The model directory served as the stable version."""
    recipe: str
    """Serving recipe name or YAML file (`qlift recipes list`)."""
    canary: Path | None = field(default=None, metadata={"parse": existing_dir, "metavar": "DIRECTORY"})
    """A second model dir deployed beside MODEL as the canary."""
    rollout: Literal["promote", "argo"] = field(default="promote", metadata={"choices": ("promote", "argo")})
    """promote: Deployments + the HTTPRoute `qlift promote` drives; argo: an Argo Rollouts Rollout and
    AnalysisTemplate with promote's checks."""
    app: str = field(default="llm", metadata={"flag": "--name"})
    """Name prefix of every object (a DNS label)."""
    namespace: str = "default"
    """Namespace of every object (a DNS label)."""
    public_model: str | None = None
    """Model name clients send; every version answers to it (default: --name)."""
    image: str | None = None
    """Container image with vLLM (default: vllm/vllm-openai:v0.26.0; cpu recipes: qlift-cpu:latest built from
    docker/Dockerfile.cpu)."""
    pvc: str = "qlift-models"
    """PersistentVolumeClaim holding the model dirs, mounted read-only at /models."""
    gateway: str = "qlift-gateway"
    """Gateway the HTTPRoute attaches to."""
    gateway_namespace: str | None = None
    """Namespace of that Gateway (default: the route's)."""
    replicas: Count = 1
    """Pods per version (the HPA's minimum)."""
    max_replicas: Count = 4
    """The HPA's maximum per version."""
    queue_target: Count = 4
    """Requests waiting per pod (vllm:num_requests_waiting) the HPA scales to hold."""
    prometheus_url: str = field(default="http://prometheus.monitoring.svc:9090", metadata={"url": True})
    """Prometheus the analysis queries (promote spec and Argo AnalysisTemplate)."""
    sets: tuple[str, ...] = field(default=(), metadata={"flag": "--set", "metavar": "KEY=VALUE"})
    """Override a recipe engine argument."""
    loras: dict[str, Path] = field(default_factory=dict)
    """Serve LoRA adapter DIR unmerged on MODEL's Deployment as model NAME (read from the PVC beside the models;
    checked against MODEL). Repeatable."""
    gateway_api: bool = False
    """Route by model name through the Gateway API Inference Extension: InferencePool, InferenceModelRewrite, an
    InferenceObjective per adapter (docs/lora.md)."""
    data_plane: Literal["gateway-api", "builtin"] = field(default="gateway-api",
                                                          metadata={"choices": ("gateway-api", "builtin")})
    """Where a rollout's weights live. gateway-api: the HTTPRoute `qlift promote` re-weights, judged on request counts
    and latency from Prometheus; builtin: a fleet of qlift routers (every answer check, the shadow phase, the judge)
    in front of a vllm-router per version (docs/deployment.md)."""
    router_replicas: Annotated[int, Range(ge=2, le=INT32_MAX)] = 2
    """qlift router pods (builtin data plane): at least 2, on different nodes where the cluster has them."""
    router_image: str = ROUTER_IMAGE
    """Image with qlift for the router fleet (builtin data plane; docker/Dockerfile)."""
    router_secret: str | None = None
    """Secret holding the routers' admin token (key admin-token) and client API keys (key api-keys), created by you,
    never rendered (builtin data plane; default: NAME-router)."""
    vllm_router_image: str = VLLM_ROUTER_IMAGE
    """Image with vllm-router, in front of each version's vLLM pods (builtin data plane)."""
    vllm_router_policy: PoolPolicy = field(default="cache_aware", metadata={"choices": (
        "cache_aware", "power_of_two", "consistent_hash", "round_robin", "random")})
    """How vllm-router picks a version's replica (builtin data plane)."""

    def __post_init__(self) -> None:
        check_fields(self)
        _check_names(self)
        if self.max_replicas < self.replicas:
            raise BadInputError(f"{self.max_replicas} must be at least replicas ({self.replicas})",
                                field="max_replicas", hint="Raise max_replicas or lower replicas (>= 1).")
        if self.gateway_api and (self.canary is not None or self.rollout == "argo"):
            raise BadInputError("the Gateway API routes to the model's Deployment by model name; a canary or an "
                                "Argo rollout splits by Service", field="gateway_api",
                                hint="Serve the candidate as an adapter (loras) with the Gateway API.")
        if self.fleet and (self.gateway_api or self.rollout == "argo"):
            raise BadInputError("the builtin data plane is the qlift routers' own split; the Gateway API Inference "
                                "Extension and Argo Rollouts each split traffic themselves", field="data_plane",
                                hint="Drop gateway_api and rollout argo, or use data_plane gateway-api.")

    @property
    def fleet(self) -> bool:
        """The data plane is the qlift router (a fleet of them here), as qlift.rollout.planes says."""
        from qlift.rollout.planes import PLANES

        return PLANES[self.data_plane].at_router

    @property
    def secret(self) -> str:
        """The routers' Secret: --router-secret, else NAME-router."""
        return self.router_secret or f"{self.app}-router"

    @property
    def served_as(self) -> str:
        """The model name clients send (--public-model, else --name)."""
        return self.public_model or self.app

    def image_for(self, device: str) -> str:
        """--image, else the default image for the recipe's device."""
        return self.image or DEFAULT_IMAGES[device]


def _check_names(opts: DeployOptions) -> None:
    """Every name that lands in an object, checked as Kubernetes checks it."""
    for name, value in (("app", opts.app), ("namespace", opts.namespace)):
        if not _DNS_LABEL.match(value):
            raise BadInputError(f"{value!r} is not a DNS label ({_LABEL_HELP}, at most 40 characters)",
                                field=name, hint="Example: chat.")
    if opts.gateway_namespace is not None and not (_DNS_LABEL.match(opts.gateway_namespace)
                                                   or _DNS_LABEL_63.match(opts.gateway_namespace)):
        raise BadInputError(f"{opts.gateway_namespace!r} is not a namespace name (a DNS label: "
                            f"{_LABEL_HELP}, at most 63 characters)", field="gateway_namespace")
    named = (("pvc", opts.pvc), ("gateway", opts.gateway), ("router_secret", opts.router_secret))
    for name, value in ((n, v) for n, v in named if v is not None):
        if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
            raise BadInputError(f"{value!r} is not a Kubernetes object name (a DNS-1123 subdomain: lowercase "
                                "letters, digits, '-' and '.', starting and ending with a letter or digit, at most "
                                "253 characters)", field=name, hint="Example: qlift-models.")
    images = (("image", opts.image), ("router_image", opts.router_image), ("vllm_router_image", opts.vllm_router_image))
    for name, ref in ((n, r) for n, r in images if r is not None):
        image = _IMAGE.match(ref)
        if image is None or len(image["name"]) > 255:
            raise BadInputError(f"{ref!r} is not an image reference ([REGISTRY[:PORT]/]NAME[:TAG][@DIGEST], "
                                "NAME in lowercase)", field=name, hint="Example: registry.local/vllm:v0.26.0.")
    if opts.public_model is not None and (not opts.public_model.strip() or not opts.public_model.isprintable()):
        raise BadInputError(f"{opts.public_model!r} must be a printable, non-empty name", field="public_model")
