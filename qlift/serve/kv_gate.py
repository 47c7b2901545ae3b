"""`--recipe auto` and the FP8 KV cache: on only where an eval gate allowed it for this checkpoint.

An FP8 KV cache halves the KV bytes per token (about twice the sequences in flight on the same GPU),
but it changes the model's answers, by how much depends on the model. So `qlift serve --recipe auto`
turns ``kv_cache_dtype=fp8`` on only where the newest gated `qlift eval` report for the checkpoint's
content hash, with the candidate run at that setting (``qlift eval ... --set kv_cache_dtype=fp8``),
passed (qlift.gates.index); it names that report, or says why it kept FP8 KV off. A recipe or a
``--set`` that names kv_cache_dtype is left as it is: the rule only fills what nobody chose.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qlift.models.modeldir import ModelDir
from qlift.models.ref import ModelRef
from qlift.serve.recipes import Recipe, apply_overrides
from qlift.vllm.engine_args import normalize

FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2")
GATE_EXAMPLE = "rougeL >= baseline - 0.02"


@dataclass(frozen=True)
class KvDecision:
    kv_cache_dtype: str | None  # what to set, or None: leave the recipe's (vLLM's "auto")
    note: str  # one line for the user: which report, or why not and how to get one
    record: dict[str, Any] | None = None  # the gate index record it rests on


def _gates_text(record: dict[str, Any], *, failed_only: bool = False) -> str:
    parts = []
    for g in record.get("gates") or []:
        if failed_only and g.get("passed"):
            continue
        v, t = g.get("value"), g.get("threshold")
        figures = f" ({v:.4g} vs {t:.4g})" if isinstance(v, float | int) and isinstance(t, float | int) else ""
        parts.append(f"{g.get('expr')}{figures}")
    return "; ".join(parts) or "no gates"


def compares_with_baseline(record: dict[str, Any]) -> bool:
    """Only a gate against the baseline (``rougeL >= baseline - 0.02``) says what FP8 KV changed;
    a report with absolute thresholds alone says nothing about it."""
    from qlift.errors import QliftError
    from qlift.gates.grammar import parse

    for g in record.get("gates") or []:
        try:
            if parse(str(g.get("expr"))).uses_baseline:
                return True
        except QliftError:
            continue
    return False


def how_to_allow(model: Path) -> str:
    return ("qlift eval " + shlex.quote(str(model)) + " --baseline BASELINE --prompts HELD_OUT.jsonl "
            "--set kv_cache_dtype=fp8 --gate " + shlex.quote(GATE_EXAMPLE) + " --report DIR")


def _no_report(model: Path, short: str | None) -> KvDecision:
    which = f" (sha256:{short})" if short else ""
    return KvDecision(None, f"FP8 KV cache off: no eval gate report against a baseline with kv_cache_dtype=fp8 "
                            f"for this checkpoint{which}; to allow it: {how_to_allow(model)}")


def decide(content_hash: str, model: Path) -> KvDecision:
    """FP8 KV for the checkpoint with ``content_hash`` (at ``model``): on, with the report, or off and why."""
    from qlift.gates.index import newest

    short = content_hash.removeprefix("sha256:")[:12]
    record = newest(content_hash, engine_arg="kv_cache_dtype", values=FP8_KV, keep=compares_with_baseline)
    if record is None:
        return _no_report(model, short)
    where = f"{record.get('report')} of {record.get('date')}"
    if not record.get("passed"):
        return KvDecision(None, f"FP8 KV cache off: the newest eval gate report with FP8 KV for this checkpoint "
                                f"(sha256:{short}), {where}, failed: {_gates_text(record, failed_only=True)}",
                          record)
    dtype = str(record["engine_args"]["kv_cache_dtype"])
    return KvDecision(dtype, f"FP8 KV cache on (kv_cache_dtype={dtype}): eval gate report {where} passed for this "
                             f"checkpoint (sha256:{short}) against {record.get('baseline')}: "
                             f"{_gates_text(record)}", record)


def apply_kv_gate(recipe: Recipe, md: ModelDir, sets: list[str], *,
                  ref: ModelRef) -> tuple[Recipe, KvDecision | None]:
    """``recipe`` with FP8 KV where the gate index allows it; None where the recipe or a --set chose already.
    ``ref``: the checkpoint's plain ref (its hash is read only where a record could match, and never twice)."""
    chosen = recipe.engine.kv_cache_dtype not in (None, "auto")
    if chosen or any(normalize(s.partition("=")[0].strip()) == "kv_cache_dtype" for s in sets):
        return recipe, None
    from qlift.gates.index import any_checkpoint_has
    if not any_checkpoint_has(engine_arg="kv_cache_dtype", values=FP8_KV, keep=compares_with_baseline):
        # No FP8-KV report for any checkpoint: off whatever this one hashes to, and `qlift plan` of a
        # 15 GB model need not read 15 GB to say so.
        return recipe, _no_report(md.path, None)
    decision = decide(ref.content_hash, md.path)
    if decision.kv_cache_dtype is None:
        return recipe, decision
    return apply_overrides(recipe, [f"kv_cache_dtype={decision.kv_cache_dtype}"]), decision
