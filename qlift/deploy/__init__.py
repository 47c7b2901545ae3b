"""qlift deploy: serving beyond one machine.

``qlift deploy k8s`` renders Kubernetes manifests for a model (and a canary) from a serving
recipe: a vLLM Deployment and Service per version, an HPA on vLLM's queue depth, the
Gateway API HTTPRoute that ``qlift promote`` drives, or an Argo Rollouts ``Rollout`` with
an ``AnalysisTemplate`` that runs promote's own checks; or, with ``--data-plane builtin``
(``fleet``), a fleet of qlift routers in front of a vllm-router per version, where every
answer check runs. Nothing is applied: the output is a kustomize directory for
``kubectl apply -k`` or GitOps.
"""

from typing import TYPE_CHECKING

from qlift.deploy.options import DeployOptions
from qlift.deploy.run import DeployInputs, run
from qlift.lazy import lazy_exports

if TYPE_CHECKING:
    from qlift.deploy.render import DeployResult, render_k8s, write_k8s

__all__ = ["DeployInputs", "DeployOptions", "DeployResult", "render_k8s", "run", "write_k8s"]

# The renderer on first use: it loads the recipe and rollout stacks, which `--help` does not need.
__getattr__ = lazy_exports(__name__, {n: "render" for n in ("DeployResult", "render_k8s", "write_k8s")})
