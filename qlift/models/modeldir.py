"""A typed view of a Hugging Face model directory, read without loading any tensor."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, NotFoundError
from qlift.fsutil import contained
from qlift.loaders import read_json, read_json_object, validated
from qlift.models.configs import ModelConfig, SafetensorsIndex
from qlift.models.safetensors_header import TensorInfo, read_header

INDEX_NAME = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
GENERATION_CONFIG = "generation_config.json"

__all__ = ["ModelDir", "TensorInfo", "load_json"]


def load_json(path: Path) -> Any:
    """A JSON file of a model or adapter directory (see qlift.loaders for what is refused)."""
    return read_json(path)


def _token_ids(values: Iterable[Any], path: Path, field: str) -> list[int]:
    ids = list(values)
    if not all(type(i) is int for i in ids):
        raise BadInputError("token ids must be integers", path=path, field=field)
    return ids


class ModelDir:
    """A model directory: config, weights, tokenizer, templates and lineage."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    @classmethod
    def open(cls, path: Path | str) -> ModelDir:
        """Open ``path`` and check it looks like a model directory."""
        p = Path(path)
        if not p.exists():
            raise NotFoundError(
                f"model directory {p} does not exist",
                hint="Check the path, or create one with `qlift download` or `qlift import-gguf`.",
            )
        if not p.is_dir():
            raise BadInputError(
                f"{p} is a file, not a model directory",
                hint="Pass the directory that holds config.json and the weights.",
            )
        if not (p / "config.json").is_file():
            raise BadInputError(
                f"{p} has no config.json, so it is not a Hugging Face model directory",
                hint="Pass the directory that holds config.json and the weights.",
            )
        return cls(p)

    # --- config-like files -------------------------------------------------
    @cached_property
    def config(self) -> dict[str, Any]:
        path = self.path / "config.json"
        data = read_json_object(path)
        validated(ModelConfig, data, path=path, hint="Fix config.json or re-download the model.")
        return data

    @property
    def text_config(self) -> dict[str, Any]:
        """The language-model part of the config (multimodal configs nest it)."""
        nested = self.config.get("text_config")
        return nested if isinstance(nested, dict) else self.config

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or []
        return str(archs[0]) if archs else str(self.config.get("model_type", "unknown"))

    @property
    def tie_word_embeddings(self) -> bool:
        # transformers' default for a config that omits the flag is True.
        return bool(self.text_config.get("tie_word_embeddings", self.config.get("tie_word_embeddings", True)))

    @property
    def vocab_size(self) -> int | None:
        v = self.text_config.get("vocab_size")
        return int(v) if v is not None else None

    @property
    def torch_dtype(self) -> str | None:
        return self.config.get("dtype") or self.config.get("torch_dtype")

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        q = self.config.get("quantization_config")
        return q if isinstance(q, dict) else None

    @cached_property
    def generation_config(self) -> dict[str, Any] | None:
        p = self.path / GENERATION_CONFIG
        return read_json_object(p) if p.is_file() else None

    @cached_property
    def tokenizer_config(self) -> dict[str, Any]:
        p = self.path / "tokenizer_config.json"
        return read_json_object(p) if p.is_file() else {}

    @property
    def tokenizer_files(self) -> list[Path]:
        return [self.path / n for n in TOKENIZER_FILES if (self.path / n).is_file()]

    @cached_property
    def chat_template(self) -> str | None:
        jinja = self.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        as_json = self.path / "chat_template.json"
        if as_json.is_file():
            tmpl = read_json_object(as_json).get("chat_template")
            if tmpl:
                return str(tmpl)
        tmpl = self.tokenizer_config.get("chat_template")
        if isinstance(tmpl, list):  # named templates: prefer "default"
            named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
            tmpl = named.get("default") or next(iter(named.values()), None)
        return str(tmpl) if tmpl else None

    @cached_property
    def tokenizer_length(self) -> int | None:
        """Number of distinct token ids the tokenizer can produce (vocab + added tokens)."""
        tj = self.path / "tokenizer.json"
        if tj.is_file():
            data = read_json_object(tj)
            model = data.get("model") or {}
            vocab = model.get("vocab") if isinstance(model, dict) else None
            if isinstance(vocab, list):  # Unigram: [piece, score] pairs, ids by position
                ids = list(range(len(vocab)))
            elif isinstance(vocab, dict) or vocab is None:
                ids = _token_ids((vocab or {}).values(), tj, "model.vocab")
            else:
                raise BadInputError("must be a map or a list", path=tj, field="model.vocab")
            added = data.get("added_tokens") or []
            if not isinstance(added, list) or not all(isinstance(t, dict) for t in added):
                raise BadInputError("must be a list of objects", path=tj, field="added_tokens")
            ids += _token_ids((t.get("id") for t in added), tj, "added_tokens")
            return len(set(ids)) or None
        vj = self.path / "vocab.json"
        if vj.is_file():
            ids = _token_ids(read_json_object(vj).values(), vj, "vocab")
            decoder = self.tokenizer_config.get("added_tokens_decoder") or {}
            if not isinstance(decoder, dict) or not all(str(k).isdigit() for k in decoder):
                raise BadInputError("must map token ids to tokens", path=self.path / "tokenizer_config.json",
                                    field="added_tokens_decoder")
            return len(set(ids) | {int(k) for k in decoder})
        return None

    # --- weights -----------------------------------------------------------
    @property
    def safetensors_files(self) -> list[Path]:
        return sorted(self.path.glob("*.safetensors"))

    @property
    def pickle_files(self) -> list[Path]:
        return sorted(p for p in self.path.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())

    @cached_property
    def index(self) -> dict[str, Any] | None:
        p = self.path / INDEX_NAME
        if not p.is_file():
            return None
        data = read_json_object(p)
        validated(SafetensorsIndex, data, path=p, hint="Fix the index or re-download the model.")
        return data

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor in the safetensors weights, by name, from the headers alone."""
        files = self.safetensors_files
        if self.index is not None:
            names = sorted(set(self.index.get("weight_map", {}).values()))
            for n in names:
                contained(self.path, n, source=self.path / INDEX_NAME)
            missing = [n for n in names if not (self.path / n).is_file()]
            if missing:
                raise NotFoundError(
                    f"{self.path / INDEX_NAME} names shard {missing[0]}, which is missing",
                    hint="Re-download the model (`qlift verify` shows what else is missing).",
                )
            files = [self.path / n for n in names]
        out: dict[str, TensorInfo] = {}
        for f in files:
            tensors, _ = read_header(f)
            out.update(tensors)
        return out

    def tensors_by_file(self) -> dict[str, list[TensorInfo]]:
        grouped: dict[str, list[TensorInfo]] = {}
        for t in self.tensors.values():
            grouped.setdefault(t.file, []).append(t)
        return grouped

    @property
    def parameter_count(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def weight_dtypes(self) -> dict[str, int]:
        """Parameter count per safetensors dtype."""
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel
        return counts

    @property
    def size_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def require_weights(self, *, allow_pickle: bool = False) -> None:
        """Fail unless there are safetensors weights (or pickle ones, when allowed)."""
        from qlift.errors import UnsafeInputError

        if self.safetensors_files:
            return
        if self.pickle_files:
            if allow_pickle:
                return
            raise UnsafeInputError(
                f"{self.path} holds only pickle weights ({self.pickle_files[0].name}), "
                "which can run arbitrary code when loaded",
                hint="Convert them to safetensors, or pass --allow-pickle if you trust the source.",
            )
        raise NotFoundError(
            f"{self.path} has no weight files (*.safetensors)",
            hint="Download the weights too, or check the directory.",
        )
