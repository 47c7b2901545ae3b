"""qlift deploy: render manifests that serve a model beyond one machine."""

from __future__ import annotations

from pathlib import Path

import click

from qlift.cli.output import emit, json_option

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
  qlift deploy k8s smollm2 --recipe cpu --set max_model_len=2048 -o k8s-cpu/ --image registry.local/qlift-cpu:1
  qlift deploy k8s smollm2 --recipe cpu --lora tickets=adapters/tickets --gateway-api -o k8s-lora/
""")
@click.argument("model", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--recipe", required=True, help="Serving recipe name or YAML file (`qlift recipes list`).")
@click.option("--canary", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="A second model dir deployed beside MODEL as the canary.")
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="Output directory (one YAML per object + kustomization.yaml).")
@click.option("--rollout", type=click.Choice(["promote", "argo"]), default="promote", show_default=True,
              help="promote: Deployments + the HTTPRoute `qlift promote` drives; argo: an Argo Rollouts Rollout "
                   "and AnalysisTemplate with promote's checks.")
@click.option("--name", "app", default="llm", show_default=True, help="Name prefix of every object (a DNS label).")
@click.option("--namespace", default="default", show_default=True)
@click.option("--public-model", help="Model name clients send; every version answers to it (default: --name).")
@click.option("--image", help="Container image with vLLM (default: vllm/vllm-openai:v0.26.0; cpu recipes: "
                              "qlift-cpu:latest built from docker/Dockerfile.cpu).")
@click.option("--pvc", default="qlift-models", show_default=True,
              help="PersistentVolumeClaim holding the model dirs, mounted read-only at /models.")
@click.option("--gateway", default="qlift-gateway", show_default=True, help="Gateway the HTTPRoute attaches to.")
@click.option("--gateway-namespace", help="Namespace of that Gateway (default: the route's).")
@click.option("--replicas", type=int, default=1, show_default=True, help="Pods per version (the HPA's minimum).")
@click.option("--max-replicas", type=int, default=4, show_default=True, help="The HPA's maximum per version.")
@click.option("--queue-target", type=int, default=4, show_default=True,
              help="Requests waiting per pod (vllm:num_requests_waiting) the HPA scales to hold.")
@click.option("--prometheus-url", default="http://prometheus.monitoring.svc:9090", show_default=True,
              help="Prometheus the analysis queries (promote spec and Argo AnalysisTemplate).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a recipe engine argument.")
@click.option("--lora", "loras", multiple=True, metavar="NAME=DIR",
              help="Serve LoRA adapter DIR unmerged on MODEL's Deployment as model NAME (read from the PVC beside "
                   "the models; checked against MODEL). Repeatable.")
@click.option("--gateway-api", is_flag=True,
              help="Route by model name through the Gateway API Inference Extension: InferencePool, "
                   "InferenceModelRewrite, an InferenceObjective per adapter (docs/lora.md).")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@json_option
def k8s_cmd(model: Path, recipe: str, canary: Path | None, out: Path, rollout: str, app: str, namespace: str,
            public_model: str | None, image: str | None, pvc: str, gateway: str, gateway_namespace: str | None,
            replicas: int, max_replicas: int, queue_target: int, prometheus_url: str, sets: tuple[str, ...],
            loras: tuple[str, ...], gateway_api: bool, force: bool) -> None:
    """Kubernetes manifests for MODEL (and --canary) served by vLLM with a recipe.

    Per version: a Deployment (the recipe's engine arguments, GPUs, /health probes, the
    model from a PVC), a Service and an HPA on vLLM's queue depth via prometheus-adapter
    (its rule is rendered too); plus the Gateway API HTTPRoute. With --canary, also
    promote-rollout.yaml for `qlift promote start -f`. Writes qlift.json (lineage).
    """
    from qlift.deploy import DeployOptions, write_k8s
    from qlift.serve.lora import parse_lora_flags

    opts = DeployOptions(
        model=model, recipe=recipe, canary=canary, rollout=rollout,  # type: ignore[arg-type]
        app=app, namespace=namespace, public_model=public_model, image=image, pvc=pvc, gateway=gateway,
        gateway_namespace=gateway_namespace, replicas=replicas, max_replicas=max_replicas,
        queue_target=queue_target, prometheus_url=prometheus_url, sets=list(sets),
        loras=parse_lora_flags(loras), gateway_api=gateway_api)
    result = write_k8s(opts, out, force=force)
    files = sorted(p.name for p in out.iterdir())
    payload = {
        "out": str(out), "recipe": result.recipe, "rollout": rollout, "image": result.image,
        "versions": result.versions, "engine_args": result.engine_args, "files": files,
        "objects": [{"file": f, "kind": o["kind"], "name": o["metadata"]["name"]} for f, o in result.objects.items()],
    }

    def human() -> None:
        click.echo(f"wrote {len(result.objects)} objects to {out} (recipe {result.recipe}, image {result.image})")
        for f, o in result.objects.items():
            click.echo(f"  {f:32} {o['kind']} {o['metadata']['name']}")
        click.echo(f"apply: kubectl apply -k {out}")
        if result.promote_spec is not None:
            click.echo(f"promote: qlift promote start -f {out / 'promote-rollout.yaml'}")

    emit(payload, human)
