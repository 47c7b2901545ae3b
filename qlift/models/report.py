"""``qlift inspect``: a summary of a model directory, computed from headers only."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError
from qlift.lineage import lineage_chain, read_manifest
from qlift.models.modeldir import ModelDir


@dataclass
class ModelReport:
    path: str
    architecture: str
    model_type: str | None
    parameters: int
    weight_dtypes: dict[str, int]
    config_dtype: str | None
    size_on_disk: int
    shards: list[str]
    tied_embeddings: bool
    vocab_size: int | None
    tokenizer_length: int | None
    hidden_size: int | None
    num_layers: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    max_position_embeddings: int | None
    has_chat_template: bool
    quantization: dict[str, Any] | None
    lineage: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)


# compressed-tensors stores these beside a quantized weight; they are not model parameters.
_QUANT_AUX = ("weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx", "input_scale", "output_scale")


def logical_parameters(md: ModelDir) -> int:
    """Parameters of the unquantized model: packed int4 words count 8 each, scales not at all."""
    bits = 4
    groups = (md.quantization_config or {}).get("config_groups") or {}
    for name, group in (groups.items() if isinstance(groups, dict) else []):
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict) and weights.get("num_bits") is not None:
            bits = weights["num_bits"]
        if type(bits) is not int or not 1 <= bits <= 32:
            raise BadInputError(f"must be an integer from 1 to 32, got {bits!r:.40}", path=md.path / "config.json",
                                field=f"quantization_config.config_groups.{name}.weights.num_bits")
    total = 0
    for t in md.tensors.values():
        if t.name.endswith(_QUANT_AUX):
            continue
        total += t.numel * (32 // bits) if t.name.endswith("weight_packed") else t.numel
    return total


def inspect_model(path: Path | str) -> ModelReport:
    md = ModelDir.open(path)
    md.require_weights(allow_pickle=True)
    tc = md.text_config
    warnings: list[str] = []
    vocab, tok_len = md.vocab_size, md.tokenizer_length
    if vocab is not None and tok_len is not None and tok_len > vocab:
        warnings.append(
            f"tokenizer has {tok_len} tokens but the embedding has only {vocab} rows: "
            "token ids past the last row will crash the model"
        )
    if not md.chat_template:
        warnings.append("no chat template: chat completions will fail on vLLM")
    if md.pickle_files and not md.safetensors_files:
        warnings.append("weights are pickle files only; qlift reads safetensors headers")
    manifest = read_manifest(md.path)
    return ModelReport(
        path=str(md.path.resolve()),
        architecture=md.architecture,
        model_type=md.config.get("model_type"),
        parameters=logical_parameters(md),
        weight_dtypes=md.weight_dtypes,
        config_dtype=md.torch_dtype,
        size_on_disk=md.size_on_disk,
        shards=[p.name for p in md.safetensors_files],
        tied_embeddings=md.tie_word_embeddings,
        vocab_size=vocab,
        tokenizer_length=tok_len,
        hidden_size=tc.get("hidden_size"),
        num_layers=tc.get("num_hidden_layers"),
        num_attention_heads=tc.get("num_attention_heads"),
        num_key_value_heads=tc.get("num_key_value_heads", tc.get("num_attention_heads")),
        max_position_embeddings=tc.get("max_position_embeddings"),
        has_chat_template=md.chat_template is not None,
        quantization=md.quantization_config,
        lineage=lineage_chain(manifest),
        manifest=manifest,
        warnings=warnings,
    )
