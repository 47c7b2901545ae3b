"""Map adapters onto a base model's tensors and check every shape before anything is written.

The plan lists every output tensor with the base tensor its bytes come from and the
adapter steps applied to it, in the order given. It also decides the tied-embedding
and vocabulary questions:

- an adapter that changes ``lm_head`` on a tied base gets an untied ``lm_head``
  (built from the embeddings as they were before that adapter) and
  ``tie_word_embeddings: false``;
- an adapter that changes only the embeddings of a tied base keeps it tied, so the
  output head follows the new embeddings, as peft's ``merge_and_unload`` does;
- embedding rows come from the tensors (an adapter that saved a resized
  ``embed_tokens`` sets ``vocab_size``); padded rows are never trimmed to the tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qlift.errors import IncompatibleError
from qlift.merge.maths import BiasAdd, Lora, Replace, Step, Tokens
from qlift.models.dtypes import FLOAT_CODES

if TYPE_CHECKING:
    from qlift.merge.adapter import Adapter, LoraModule
    from qlift.models.modeldir import ModelDir

LM_HEAD = "lm_head.weight"
_EMBED_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight")
FLOAT_DTYPES = FLOAT_CODES


@dataclass
class Entry:
    """One output tensor: where its bytes come from and what happens to them."""

    name: str
    source: str  # base tensor name
    shape: tuple[int, ...]
    in_dtype: str
    out_dtype: str = ""
    steps: list[Step] = field(default_factory=list)


@dataclass
class Plan:
    entries: dict[str, Entry]
    tied: bool
    untied: bool
    vocab_rows: int | None
    embed_name: str | None
    notes: list[str] = field(default_factory=list)
    targets: int = 0  # adapter modules applied, all adapters together

    def sources(self) -> dict[str, list[Entry]]:
        out: dict[str, list[Entry]] = {}
        for e in self.entries.values():
            out.setdefault(e.source, []).append(e)
        return out


def _embed_name(names: list[str]) -> str | None:
    return next((n for n in names if n.endswith(_EMBED_SUFFIXES)), None)


class _Builder:
    def __init__(self, base: ModelDir) -> None:
        infos = base.tensors
        self.base = base
        self.entries = {n: Entry(n, n, t.shape, t.dtype) for n, t in infos.items()}
        self.embed = _embed_name(list(self.entries))
        self.tied = base.tie_word_embeddings and LM_HEAD not in self.entries and self.embed is not None
        self.untied = False
        self.notes: list[str] = []
        self.targets = 0

    def _entry(self, adapter: Adapter, name: str, what: str) -> Entry:
        e = self.entries.get(name)
        if e is None:
            raise IncompatibleError(
                f"adapter {adapter.path} {what}, but the base model {self.base.path} has no tensor {name}",
                hint="Check that the adapter was trained on this base model (adapter_config.json: "
                "base_model_name_or_path).",
            )
        return e

    def _untie(self) -> None:
        assert self.embed is not None
        emb = self.entries[self.embed]
        head = Entry(LM_HEAD, emb.source, emb.shape, emb.in_dtype, steps=list(emb.steps))
        items = list(self.entries.items())
        at = [n for n, _ in items].index(self.embed) + 1
        self.entries = dict(items[:at] + [(LM_HEAD, head)] + items[at:])
        self.tied, self.untied = False, True
        self.notes.append("lm_head changed on a tied base: wrote an untied lm_head (tie_word_embeddings: false)")

    def add(self, adapter: Adapter, k: int) -> None:
        import torch

        repl, tokens = dict(adapter.replacements), dict(adapter.tokens)
        head_module = LM_HEAD.rsplit(".", 1)[0]
        embed_module = self.embed.rsplit(".", 1)[0] if self.embed else ""
        # peft saves a tied head beside the embeddings; when it holds nothing of its own, it stays tied
        if self.tied and LM_HEAD in repl and self.embed in repl and torch.equal(repl[LM_HEAD], repl[self.embed]):
            del repl[LM_HEAD]
        if self.tied and head_module in tokens and embed_module in tokens:
            (hi, hr), (ei, er) = tokens[head_module], tokens[embed_module]
            if hi == ei and torch.equal(hr, er):
                del tokens[head_module]
        if self.tied and (LM_HEAD in repl or head_module in adapter.loras or head_module in tokens):
            self._untie()
        for name, tensor in repl.items():
            e = self._entry(adapter, name, f"saves a full {name}")
            resizable = name in (self.embed, LM_HEAD)
            if tuple(tensor.shape) != e.shape and not (resizable and tuple(tensor.shape[1:]) == e.shape[1:]):
                raise IncompatibleError(
                    f"adapter {adapter.path} saves {name} with shape {tuple(tensor.shape)}, "
                    f"the base has {e.shape}", hint="Use the base model the adapter was trained on.")
            e.shape = tuple(tensor.shape)
            e.steps = [Replace(tensor, k)]
        for lm in adapter.loras.values():
            self._add_lora(adapter, lm, k)
        for module, (ids, rows) in tokens.items():
            e = self._entry(adapter, f"{module}.weight", f"has trainable tokens for {module}")
            if rows.shape != (len(ids), e.shape[1]) or max(ids, default=0) >= e.shape[0] or min(ids, default=0) < 0:
                raise IncompatibleError(
                    f"adapter {adapter.path}: trainable tokens {ids} with rows {tuple(rows.shape)} do not fit "
                    f"{e.name} {e.shape}", hint="Use the base model the adapter was trained on.")
            e.steps.append(Tokens(ids, rows, k))
        self.targets += len(adapter.modules())

    def _add_lora(self, adapter: Adapter, lm: LoraModule, k: int) -> None:
        assert lm.A is not None and lm.B is not None
        e = self._entry(adapter, f"{lm.module}.weight", f"targets module {lm.module}")
        fif = adapter.fan_in_fan_out and not lm.embedding
        if lm.embedding:
            want: tuple[int, ...] = (lm.A.shape[1], lm.B.shape[0])
        else:
            want = (lm.B.shape[0], lm.A.shape[1])
            want = want[::-1] if fif else want
        if e.shape != want:
            raise IncompatibleError(
                f"adapter {adapter.path}: LoRA on {lm.module} makes a {want} update, the base weight is {e.shape}",
                hint="Use the base model the adapter was trained on.")
        if lm.magnitude is not None:
            cols = e.shape[1] if lm.embedding else (e.shape[1] if fif else e.shape[0])
            if tuple(lm.magnitude.shape) != (cols,):
                raise IncompatibleError(
                    f"adapter {adapter.path}: DoRA magnitude of {lm.module} has shape {tuple(lm.magnitude.shape)}, "
                    f"expected ({cols},)", hint="Re-save the adapter with peft.")
        e.steps.append(Lora(lm, fif, k))
        if lm.bias is not None:
            b = self._entry(adapter, f"{lm.module}.bias", f"has lora_bias on {lm.module}")
            if tuple(lm.bias.shape) != b.shape:
                raise IncompatibleError(f"adapter {adapter.path}: lora bias of {lm.module} has shape "
                                        f"{tuple(lm.bias.shape)}, the base bias {b.shape}",
                                        hint="Use the base model the adapter was trained on.")
            b.steps.append(BiasAdd(lm.bias, lm.scale, k))

    def finish(self, out_dtype: str | None) -> Plan:
        vocab = self.entries[self.embed].shape[0] if self.embed else None
        head = self.entries.get(LM_HEAD)
        if vocab is not None and head is not None and head.shape[0] != vocab:
            raise IncompatibleError(
                f"after merging, {self.embed} has {vocab} rows but {LM_HEAD} has {head.shape[0]}",
                hint="An adapter that resizes the vocabulary must save both embedding layers "
                "(peft's save_embedding_layers=True).")
        if self.embed and self.tied and any(self.entries[self.embed].steps):
            self.notes.append("embeddings changed on a tied base: kept tied, so lm_head follows them")
        for e in self.entries.values():
            e.out_dtype = out_dtype if (out_dtype and e.in_dtype in FLOAT_DTYPES) else e.in_dtype
        return Plan(self.entries, self.tied, self.untied, vocab, self.embed, self.notes, self.targets)


def build_plan(base: ModelDir, adapters: list[Adapter], *, out_dtype: str | None) -> Plan:
    """Every output tensor with its steps; raises before any output exists if something does not fit."""
    b = _Builder(base)
    for k, adapter in enumerate(adapters):
        b.add(adapter, k)
    return b.finish(out_dtype)


def updated_config(config: dict[str, Any], plan: Plan, dtype_name: str) -> dict[str, Any]:
    """config.json for the merged model: dtype, vocab size, tie flag; no peft or path leftovers."""
    cfg = {k: v for k, v in config.items() if k not in ("_name_or_path", "quantization_config")}
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    cfg["dtype"] = dtype_name
    if "torch_dtype" in cfg:
        cfg["torch_dtype"] = dtype_name
    for c in (cfg, text):
        if c is None:
            continue
        if plan.vocab_rows is not None and (c is text or text is None or "vocab_size" in c):
            c["vocab_size"] = plan.vocab_rows
        if plan.untied and (c is text or text is None or "tie_word_embeddings" in c):
            c["tie_word_embeddings"] = False
    return cfg
