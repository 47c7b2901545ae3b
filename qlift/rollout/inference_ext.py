"""The Gateway API Inference Extension as the data plane: an ``InferenceModelRewrite`` whose targets'
weights split the public model name between models served on one Deployment (a base and its LoRA
adapter, which a plain HTTPRoute sees as one backend).

The object is the one `qlift deploy k8s --lora NAME=DIR --gateway-api` renders
(qlift.k8s_objects.model_rewrite), validated against the CRD schema (schemas/, a byte-exact
copy of tests/schemas/inference-extension/'s) and applied as the HTTPRoute plane applies its route:
merge-patched through the kubernetes client, created on the first change; ``output`` also writes
the YAML. A weight of 0 leaves the model out of the targets (the CRD's weights start at 1).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

from qlift.k8s_objects import X_API, model_rewrite
from qlift.loaders import read_yaml
from qlift.rollout.gateway import CustomObject, crd_schema, validate_object, write_yaml
from qlift.rollout.planes import PLANES, Capability
from qlift.rollout.spec import InferenceExtSpec, RolloutSpec

GROUP, VERSION = X_API.split("/")
PLURAL = "inferencemodelrewrites"
SCHEMA_FILE = Path(__file__).with_name("schemas") / f"{GROUP}_{PLURAL}.yaml"


@functools.cache
def rewrite_schema() -> dict[str, Any]:
    return crd_schema(SCHEMA_FILE, VERSION)


def render_rewrite(spec: InferenceExtSpec, models: dict[str, str], weights: dict[str, int]) -> dict[str, Any]:
    """The InferenceModelRewrite for ``weights`` (version -> percent), ``models`` naming each version's model."""
    return model_rewrite(app=spec.app, namespace=spec.namespace, public_model=spec.public_model or spec.app,
                         weights={models.get(v, v): w for v, w in weights.items()})


def validate_rewrite(obj: dict[str, Any]) -> None:
    validate_object(obj, rewrite_schema(), field="inference_ext")


def rewrite_weights(obj: dict[str, Any], models: dict[str, str]) -> dict[str, int]:
    """Version -> percent of the public model's requests, read from the first rule's targets (weights are
    relative); a version without a target has 0, a target that is no version's model shows under its name."""
    targets = [t for rule in obj.get("spec", {}).get("rules", [])[:1] for t in rule.get("targets", [])]
    total = sum(int(t.get("weight", 1)) for t in targets) or 1
    by_model = {m: v for v, m in models.items()}
    out = dict.fromkeys(models, 0)
    for t in targets:
        key = by_model.get(t["modelRewrite"], t["modelRewrite"])
        out[key] = out.get(key, 0) + round(100 * int(t.get("weight", 1)) / total)
    return out


class InferenceExtDataPlane:
    kind = "inference-ext"
    capabilities: ClassVar[frozenset[Capability]] = PLANES["inference-ext"].capabilities

    def __init__(self, spec: InferenceExtSpec, models: dict[str, str]) -> None:
        self.spec, self.models = spec, models
        self.object = None if spec.kubeconfig is None else CustomObject(
            spec.kubeconfig, spec.context, GROUP, VERSION, PLURAL, spec.namespace, f"{spec.app}-rewrite")

    def weights(self) -> dict[str, int] | None:
        obj: dict[str, Any] | None = None
        if self.object is not None:
            obj = self.object.get()
        elif self.spec.output is not None and Path(self.spec.output).exists():
            obj = read_yaml(Path(self.spec.output))
        return rewrite_weights(obj, self.models) if obj else None

    def set_weights(self, weights: dict[str, int]) -> None:
        obj = render_rewrite(self.spec, self.models, weights)
        validate_rewrite(obj)
        if self.spec.output is not None:
            write_yaml(self.spec.output, obj)
        if self.object is not None:
            self.object.apply(obj)

    def backend_models(self) -> dict[str, str]:
        return dict(self.models)

    def backend_urls(self) -> dict[str, str]:
        return {}


def make_inference_ext_plane(spec: RolloutSpec, *, router_token: str | None) -> InferenceExtDataPlane:
    assert spec.inference_ext is not None
    return InferenceExtDataPlane(spec.inference_ext, {v: spec.served_model(v) for v in (spec.stable, spec.canary)})
