"""qlift deploy: render manifests that serve a model beyond one machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from qlift.cli.options import click_options
from qlift.cli.output import emit, json_option
from qlift.deploy.options import DeployOptions
from qlift.options import field_docs

GROUP_EPILOG = """\b
Examples:
  qlift deploy k8s merged --recipe chat-h100 -o k8s/
  qlift deploy k8s merged --recipe chat-h100 --canary merged-awq -o k8s/ --force
  qlift deploy k8s merged --recipe chat-h100 --canary merged-awq --rollout argo -o k8s-argo/
  kubectl apply -k k8s/ && qlift promote start -f k8s/promote-rollout.yaml
"""


@click.group("deploy", epilog=GROUP_EPILOG)
def deploy_group() -> None:
    """Render deployment manifests from a serving recipe (nothing is applied).

    For one machine with docker, docker/compose.yaml runs stable + canary vLLM, the qlift
    router and Prometheus (docs/deployment.md).
    """


@deploy_group.command("k8s", epilog="""\b
Examples:
  qlift deploy k8s merged --recipe chat-h100 -o k8s/
  qlift deploy k8s merged --recipe chat-a100-80g --canary merged-awq -o k8s/ --namespace serving
  qlift deploy k8s merged --recipe chat-h100 --canary merged-awq --rollout argo -o k8s-argo/ --json
  qlift deploy k8s merged --recipe chat-h100 --canary merged-awq --data-plane builtin -o k8s-fleet/
  qlift deploy k8s smollm2 --recipe cpu --set max_model_len=2048 -o k8s-cpu/ --image registry.local/qlift-cpu:1
  qlift deploy k8s smollm2 --recipe cpu --lora tickets=adapters/tickets --gateway-api -o k8s-lora/
""")
@click.argument("model", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="Output directory (one YAML per object + kustomization.yaml).")
@click_options(DeployOptions, exclude=("model", "loras"))
@click.option("--lora", "loras", multiple=True, metavar="NAME=DIR", help=field_docs(DeployOptions)["loras"])
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@json_option
def k8s_cmd(model: Path, out: Path, loras: tuple[str, ...], force: bool, **options: Any) -> None:
    """Kubernetes manifests for MODEL (and --canary) served by vLLM with a recipe.

    Per version: a Deployment (the recipe's engine arguments, GPUs, /health probes, the
    model from a PVC), a Service and an HPA on vLLM's queue depth via prometheus-adapter
    (its rule is rendered too); plus the Gateway API HTTPRoute. With --canary, also
    promote-rollout.yaml for `qlift promote start -f`. Writes qlift.json (lineage).

    With --data-plane builtin, no HTTPRoute: a fleet of qlift routers (Deployment, PodDisruptionBudget,
    a Service and a headless Service, admin token and API keys from the Secret --router-secret) in
    front of a vllm-router per version, and the promote spec names the fleet (docs/deployment.md).
    """
    from qlift.deploy import DeployInputs, run
    from qlift.serve.lora import parse_lora_flags

    opts = DeployOptions(model=model, loras=parse_lora_flags(loras), **options)
    result = run(DeployInputs(out, force=force), opts)
    files = sorted(p.name for p in out.iterdir())
    payload = {
        "out": str(out), "recipe": result.recipe, "rollout": opts.rollout, "data_plane": opts.data_plane,
        "image": result.image, "promote_spec": result.promote_file if result.promote_spec is not None else None,
        "versions": result.versions, "engine_args": result.engine_args, "files": files,
        "objects": [{"file": f, "kind": o["kind"], "name": o["metadata"]["name"]} for f, o in result.objects.items()],
    }

    def human() -> None:
        click.echo(f"wrote {len(result.objects)} objects to {out} (recipe {result.recipe}, image {result.image})")
        for f, o in result.objects.items():
            click.echo(f"  {f:32} {o['kind']} {o['metadata']['name']}")
        click.echo(f"apply: kubectl apply -k {out}")
        if result.promote_spec is not None:
            click.echo(f"promote: qlift promote start -f {out / result.promote_file}")

    emit(payload, human)
