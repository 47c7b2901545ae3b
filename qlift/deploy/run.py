"""The deploy stage's entry point: ``run(DeployInputs, DeployOptions) -> DeployResult``.

The models (``--canary`` too) are ``DeployOptions`` fields, as the renderer reads them there; the inputs say
where the manifests go.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qlift.deploy.options import DeployOptions
    from qlift.deploy.render import DeployResult


@dataclass(frozen=True)
class DeployInputs:
    """Where the kustomize directory goes (None: render only, write nothing); ``force`` replaces one there."""

    output: Path | None = None
    force: bool = False


def run(inputs: DeployInputs, options: DeployOptions) -> DeployResult:
    """Render the Kubernetes manifests ``options`` describe, and write them to ``inputs.output`` if given."""
    from qlift.deploy.render import render_k8s, write_k8s

    if inputs.output is None:
        return render_k8s(options)
    return write_k8s(options, inputs.output, force=inputs.force)
