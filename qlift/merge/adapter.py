"""Read a peft adapter directory into the parts a merge applies.

Keys are parsed the way peft saves them (adapter names already stripped):
``base_model.model.<module>.lora_A.weight``, ``.lora_B.weight``, ``.lora_B.bias``,
``.lora_magnitude_vector``, ``.lora_embedding_A/B``,
``.token_adapter.trainable_tokens_delta``, ``.base_layer.weight`` (embeddings saved
with the adapter) and plain ``<module>.weight`` for ``modules_to_save`` (beside which a
resized vocabulary adds ``.modules_to_save.weight`` and ``.original_module.weight``; see
``_replacements``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlift.errors import BadInputError, IncompatibleError, NotFoundError, UnsafeInputError
from qlift.loaders import read_json_object, validated
from qlift.models.configs import AdapterConfig
from qlift.models.safetensors_header import read_header

if TYPE_CHECKING:
    import torch

PREFIX = "base_model.model."
SAFE_NAME = "adapter_model.safetensors"
PICKLE_NAME = "adapter_model.bin"

# LoRA config fields whose variants change what merging means; qlift refuses them.
_UNMERGEABLE = {
    "use_bdlora": "BD-LoRA",
    "alora_invocation_tokens": "activated LoRA (aLoRA), which is applied only after its invocation tokens",
    "arrow_config": "Arrow routing",
    "velora_config": "VeLoRA",
    "monteclora_config": "MonteCLoRA",
    "mica": "MiCA",
    "kasa_config": "KaSA",
    "layer_replication": "layer replication",
    "target_parameters": "LoRA on bare parameters (target_parameters)",
}
_SUFFIXES = (
    ("lora_A.weight", "A"), ("lora_B.weight", "B"), ("lora_B.bias", "bias"),
    ("lora_magnitude_vector.weight", "magnitude"), ("lora_magnitude_vector", "magnitude"),
    ("lora_embedding_A", "emb_A"), ("lora_embedding_B", "emb_B"),
    ("trainable_tokens_delta", "tokens"),
)


@dataclass
class LoraModule:
    """The LoRA parameters of one targeted module."""

    module: str
    r: int
    alpha: float
    scale: float
    A: torch.Tensor | None = None
    B: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    magnitude: torch.Tensor | None = None
    embedding: bool = False


@dataclass
class Adapter:
    path: Path
    config: dict[str, Any]
    loras: dict[str, LoraModule] = field(default_factory=dict)
    replacements: dict[str, torch.Tensor] = field(default_factory=dict)  # base tensor name -> tensor
    tokens: dict[str, tuple[list[int], torch.Tensor]] = field(default_factory=dict)  # module -> (ids, rows)

    @property
    def fan_in_fan_out(self) -> bool:
        return bool(self.config.get("fan_in_fan_out"))

    @property
    def base_name(self) -> str | None:
        v = self.config.get("base_model_name_or_path")
        return str(v) if v else None

    def modules(self) -> set[str]:
        return set(self.loras) | set(self.tokens) | {n.rsplit(".", 1)[0] for n in self.replacements}


def _pattern_key(keys: list[str], name: str) -> str:
    """peft's get_pattern_key: the first pattern matching the end of the module name."""
    for key in keys:
        if re.match(rf"(.*\.)?({key})$", name):
            return key
    return name


def _token_indices(config: dict[str, Any], module: str) -> list[int]:
    spec = config.get("trainable_token_indices")
    if isinstance(spec, list):
        return [int(i) for i in spec]
    if isinstance(spec, dict):
        for key, ids in spec.items():
            if module == key or module.endswith("." + key):
                return [int(i) for i in ids]
    raise BadInputError(
        f"the adapter has trainable tokens for {module} but adapter_config.json names no indices for it",
        field="trainable_token_indices", hint="Re-save the adapter with peft.",
    )


def _load_tensors(path: Path, allow_pickle: bool) -> dict[str, torch.Tensor]:
    safe, pickled = path / SAFE_NAME, path / PICKLE_NAME
    if safe.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        read_header(safe)  # every header defect and a truncated file, named, before torch reads it
        try:
            tensors = load_file(safe)
        except (SafetensorError, OSError, ValueError) as exc:
            raise BadInputError(f"not a readable safetensors file ({exc})", path=safe,
                                hint="Re-save the adapter with peft.") from None
    elif pickled.is_file():
        if not allow_pickle:
            raise UnsafeInputError(
                f"adapter {path} holds only {PICKLE_NAME} (pickle), which can run arbitrary code when loaded",
                hint="Re-save it as safetensors, or pass --allow-pickle if you trust its source.",
            )
        import pickle

        import torch

        try:
            data = torch.load(pickled, map_location="cpu", weights_only=True)
        except (RuntimeError, EOFError, ValueError, OSError, pickle.UnpicklingError) as exc:
            raise BadInputError(f"not a readable torch checkpoint ({type(exc).__name__}: {str(exc)[:120]})",
                                path=pickled, hint="Re-save the adapter with peft.") from None
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                 for k, v in data.items()):
            raise BadInputError("must hold a map of tensor names to tensors", path=pickled,
                                hint="Re-save the adapter with peft.")
        tensors = dict(data)
    else:
        raise NotFoundError(f"adapter {path} has no {SAFE_NAME}",
                            hint="Pass the directory peft's save_pretrained wrote.")
    _check_values(safe if safe.is_file() else pickled, tensors)
    return tensors


def _check_values(source: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Adapter weights are floating point and finite: a NaN or Inf would spread through the merged
    weights silently (verify may be off, and a NaN logit compares as no difference)."""
    import torch

    for name, t in tensors.items():
        if not t.is_floating_point():
            raise BadInputError(f"holds {t.dtype}, an adapter weight must be floating point", path=source,
                                field=name, hint="Re-save the adapter with peft.")
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise BadInputError(f"holds {bad} NaN or Inf value(s)", path=source, field=name,
                                hint="The training run diverged; use an earlier checkpoint.")


def read_adapter_config(path: Path) -> tuple[dict[str, Any], str]:
    """A peft adapter directory's ``adapter_config.json`` and its upper-cased ``peft_type``."""
    if not path.is_dir():
        raise NotFoundError(f"adapter directory {path} does not exist", hint="Check the path.")
    cfg_path = path / "adapter_config.json"
    if not cfg_path.is_file():
        raise BadInputError(f"{path} has no adapter_config.json, so it is not a peft adapter",
                            hint="Pass the directory peft's save_pretrained wrote.")
    config = read_json_object(cfg_path)
    return config, str(config.get("peft_type") or "").upper()


def load_adapter(path: Path, *, allow_pickle: bool = False) -> Adapter:
    """Read and check an adapter directory; raise a QliftError naming what is unsupported."""
    path = Path(path)
    config, peft_type = read_adapter_config(path)
    if peft_type != "LORA":
        raise IncompatibleError(
            f"adapter {path} is a {peft_type or 'unknown'} adapter; qlift merges only LoRA adapters "
            "(including DoRA, rsLoRA, trainable tokens and modules_to_save)",
            hint="Merge it with peft's merge_and_unload, or convert it to LoRA first.",
        )
    for key, what in _UNMERGEABLE.items():
        if config.get(key):
            raise IncompatibleError(f"adapter {path} uses {what} ({key}), which qlift cannot merge",
                                    hint="Merge it with peft's merge_and_unload.")
    validated(AdapterConfig, config, path=path / "adapter_config.json",
              hint="Fix adapter_config.json or re-save the adapter with peft.")
    tensors = _load_tensors(path, allow_pickle)
    if not tensors:
        raise BadInputError("holds no tensors", path=path / SAFE_NAME, hint="Re-save the adapter with peft.")
    return _parse(path, config, tensors)


def _parse(path: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Adapter:
    adapter = Adapter(path=path, config=config)
    r0 = int(config.get("r", 8))
    alpha0 = float(config.get("lora_alpha", r0))
    rank_pattern = config.get("rank_pattern") or {}
    alpha_pattern = config.get("alpha_pattern") or {}
    rslora = bool(config.get("use_rslora"))
    full: dict[str, torch.Tensor] = {}  # whole tensors: modules_to_save and saved embedding layers
    for key, tensor in tensors.items():
        if not key.startswith(PREFIX):
            raise BadInputError(f"unexpected tensor name {key!r} (peft names start with {PREFIX!r})",
                                path=path / SAFE_NAME, hint="Re-save the adapter with peft.")
        name = key[len(PREFIX):]
        split = _split(name)
        if split is None:
            full[name] = tensor
            continue
        module, kind = split
        if kind == "tokens":
            module = module.removesuffix(".token_adapter")
            adapter.tokens[module] = (_token_indices(config, module), tensor)
            continue
        lm = adapter.loras.get(module)
        if lm is None:
            r = int(rank_pattern.get(_pattern_key(list(rank_pattern), module), r0))
            alpha = float(alpha_pattern.get(_pattern_key(list(alpha_pattern), module), alpha0))
            scale = alpha / math.sqrt(r) if rslora else alpha / r
            lm = adapter.loras[module] = LoraModule(module=module, r=r, alpha=alpha, scale=scale)
        if kind in ("A", "emb_A"):
            lm.A = tensor
        elif kind in ("B", "emb_B"):
            lm.B = tensor
        elif kind == "bias":
            lm.bias = tensor
        else:
            lm.magnitude = tensor
        lm.embedding = lm.embedding or kind.startswith("emb_")
    adapter.replacements = _replacements(path, full)
    for lm in adapter.loras.values():
        _check_rank(adapter, lm)
    return adapter


def _replacements(path: Path, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole tensors replacing the base's, under the base's names, as peft's loader maps them.

    With embedding layers saved (a resized vocabulary, or ``save_embedding_layers=True``), a
    ``modules_to_save`` module ``X`` is saved three times: ``X.weight`` is the trained copy, the one
    peft loads; ``X.modules_to_save.weight`` repeats it and peft's loader ignores it;
    ``X.original_module.weight`` is the base layer as the adapter saw it (resized), which
    ``merge_and_unload`` discards with the wrapper. Wrapped embeddings (``X.base_layer.weight``,
    ``X.token_adapter.base_layer.weight``) are the layer itself.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in full.items():
        if ".original_module." in name:
            continue
        if ".modules_to_save." in name:
            if name.replace(".modules_to_save.", ".") not in full:
                raise BadInputError(
                    f"holds {name} but not the {name.replace('.modules_to_save.', '.')} peft loads it from",
                    path=path / SAFE_NAME, hint="Re-save the adapter with peft's save_pretrained.")
            continue
        out[name.replace(".token_adapter.", ".").replace(".base_layer.", ".")] = tensor
    return out


def _split(name: str) -> tuple[str, str] | None:
    """'m.lora_A.weight' -> ('m', 'A'); None for a plain tensor name."""
    for suffix, kind in _SUFFIXES:
        if name.endswith("." + suffix):
            return name[: -len(suffix) - 1], kind
    return None


def _check_rank(adapter: Adapter, lm: LoraModule) -> None:
    where = f"adapter {adapter.path}, module {lm.module}"
    if lm.A is None or lm.B is None:
        raise BadInputError(f"{where}: lora_A or lora_B is missing", hint="Re-save the adapter with peft.")
    if lm.A.ndim != 2 or lm.B.ndim != 2:
        raise IncompatibleError(f"{where}: only 2-D LoRA weights (Linear, Embedding) can be merged; "
                                f"got {tuple(lm.A.shape)}", hint="Merge it with peft's merge_and_unload.")
    rank_a, rank_b = lm.A.shape[0], lm.B.shape[1]
    if rank_a != rank_b or rank_a != lm.r:
        raise BadInputError(
            f"{where}: inconsistent rank (config r={lm.r}, lora_A has {rank_a} rows, lora_B {rank_b} columns)",
            hint="Check r and rank_pattern in adapter_config.json.",
        )
