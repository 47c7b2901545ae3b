"""qlift deploy: serving beyond one machine.

``qlift deploy k8s`` renders Kubernetes manifests for a model (and a canary) from a serving
recipe: a vLLM Deployment and Service per version, an HPA on vLLM's queue depth, the
Gateway API HTTPRoute that ``qlift promote`` drives, or an Argo Rollouts ``Rollout`` with
an ``AnalysisTemplate`` that runs promote's own checks. Nothing is applied: the output is
a kustomize directory for ``kubectl apply -k`` or GitOps.
"""

from qlift.deploy.render import DeployOptions, DeployResult, render_k8s, write_k8s

__all__ = ["DeployOptions", "DeployResult", "render_k8s", "write_k8s"]
