"""Typed views of the JSON files of a model or adapter directory, checked on load.

Only the fields qlift computes with are typed; everything else passes through
(``extra="allow"``), so a config from a newer transformers or peft still loads.
Types are strict: ``"8"`` is not a rank and ``true`` is not a layer count.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

PositiveInt = Annotated[int, Field(strict=True, gt=0)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Bool = Annotated[bool, Field(strict=True)]
Str = Annotated[str, Field(strict=True)]
TokenIds = NonNegativeInt | list[NonNegativeInt]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ModelConfig(_Open):
    """config.json: the fields that decide shapes, memory and dtype."""

    architectures: list[Str] | None = None
    model_type: Str | None = None
    vocab_size: PositiveInt | None = None
    hidden_size: PositiveInt | None = None
    intermediate_size: PositiveInt | None = None
    num_hidden_layers: PositiveInt | None = None
    num_attention_heads: PositiveInt | None = None
    num_key_value_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    max_position_embeddings: PositiveInt | None = None
    sliding_window: NonNegativeInt | None = None
    tie_word_embeddings: Bool | None = None
    dtype: Str | None = None
    torch_dtype: Str | None = None
    quantization_config: dict[str, Any] | None = None
    text_config: ModelConfig | None = None


class SafetensorsIndex(_Open):
    """model.safetensors.index.json."""

    weight_map: dict[str, Str]
    metadata: dict[str, Any] | None = None


class AdapterConfig(_Open):
    """adapter_config.json of a peft LoRA adapter (peft's defaults where a field is absent)."""

    peft_type: Str | None = None
    base_model_name_or_path: Str | None = None
    r: PositiveInt = 8
    lora_alpha: Number | None = None  # absent: r; an explicit null is refused below
    rank_pattern: dict[str, PositiveInt] | None = None
    alpha_pattern: dict[str, Number] | None = None
    use_rslora: Bool = False
    use_dora: Bool = False
    fan_in_fan_out: Bool = False
    trainable_token_indices: list[NonNegativeInt] | dict[str, list[NonNegativeInt]] | None = None

    @field_validator("lora_alpha", mode="before")
    @classmethod
    def _not_null(cls, v: Any) -> Any:
        if v is None:
            raise ValueError("must be a number, not null (leave it out to use r)")
        return v


class GenerationConfig(_Open):
    """generation_config.json: the sampling defaults vLLM and transformers read from it."""

    do_sample: Bool | None = None
    temperature: NonNegative | None = None
    top_p: Annotated[float, Field(strict=True, gt=0, le=1)] | None = None
    min_p: Annotated[float, Field(strict=True, ge=0, le=1)] | None = None
    top_k: NonNegativeInt | None = None
    repetition_penalty: Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)] | None = None
    max_length: PositiveInt | None = None
    max_new_tokens: PositiveInt | None = None
    bos_token_id: TokenIds | None = None
    eos_token_id: TokenIds | None = None
    pad_token_id: TokenIds | None = None
