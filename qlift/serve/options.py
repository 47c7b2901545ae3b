"""What a server can be asked to be besides MODEL: the one definition ``prepare`` and ``run`` take and
``qlift serve``'s options are generated from (``qlift plan`` and ``qlift recipes list`` take their
recipe and hardware options from it too)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from qlift.errors import BadInputError
from qlift.options import Range, Seconds, check_fields

WORKLOADS = ("chat", "long-doc", "multi-tenant", "batch")  # qlift.serve.recipes.Workload, without its imports
# vllm-router's --policy values that suit a pool of plain replicas (kv_aware needs KV events; sticky_least_loaded
# and the PD policies need more than a worker list).
ROUTER_POLICIES = ("power_of_two", "cache_aware", "round_robin", "consistent_hash", "random")


@dataclass(frozen=True)
class ServeOptions:
    recipe: str = field(default="auto", metadata={"short": "-r", "metavar": "NAME|auto|FILE"})
    """Recipe name (`qlift recipes list`), a recipe YAML file, or auto."""
    workload: str = field(default="chat", metadata={"choices": WORKLOADS})
    """What the server is for; --recipe auto picks among recipes of this workload."""
    sets: tuple[str, ...] = field(default=(), metadata={"flag": "--set", "metavar": "KEY=VALUE"})
    """Override a vLLM argument, engine or server (vLLM's name), e.g. --set max_model_len=8192 or --set
    api_server_count=4. Repeatable."""
    host: str = "127.0.0.1"
    """Address to bind (0.0.0.0 exposes it)."""
    port: Annotated[int, Range(ge=0, le=65535)] = 8000
    """Port for the OpenAI-compatible API (0: any free port)."""
    served_model_name: str | None = None
    """Model name clients send (default: the directory name)."""
    api_key_env: str | None = field(default=None, metadata={"metavar": "NAME"})
    """Require this API key, read from environment variable NAME (never printed)."""
    loras: dict[str, Path] = field(default_factory=dict)
    """Also serve LoRA adapter DIR unmerged as model NAME, checked against MODEL first. Repeatable."""
    lora_runtime: bool = False
    """Let `qlift lora load|unload` add adapters while it runs (binds 127.0.0.1 or needs --api-key-env)."""
    dry_run: bool = False
    """Print the command, config and plan; start nothing."""
    timeout_s: Seconds = field(default=900, metadata={"flag": "--timeout"})
    """Seconds to wait for /health."""
    drain_s: Annotated[int, Range(ge=0, le=3600)] = field(default=30, metadata={"flag": "--drain"})
    """On Ctrl-C/SIGTERM, seconds in-flight requests get to finish before vLLM stops (vLLM's
    --shutdown-timeout; 0: abort them)."""
    access_log: bool = False
    """Show vLLM's HTTP access lines (health checks included) on the terminal too; vllm.log always has them."""
    gpu: str | None = field(default=None, metadata={"metavar": "NAME"})
    """Plan for this GPU instead of the detected hardware, e.g. "RTX 4090", T4, A100-80GB."""
    gpus: Annotated[int, Range(ge=1, le=64)] | None = None
    """With --gpu: how many of them."""
    replicas: Annotated[int, Range(ge=1, le=64)] = 1
    """Serve with N vLLM servers behind one vllm-router (one URL), the CPU cores or GPUs split between them."""
    router_policy: str = field(default="power_of_two", metadata={"choices": ROUTER_POLICIES})
    """With --replicas: vllm-router's policy (power_of_two: the less loaded of two; cache_aware: the replica holding
    the longest matching prefix, for prompts that share long prefixes)."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.gpu and not self.dry_run:
            raise BadInputError("--gpu simulates hardware, so it only works with --dry-run", field="gpu",
                                hint="Drop --gpu to serve on this machine, or add --dry-run.")
