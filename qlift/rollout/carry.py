"""The held evidence the analysis carries into the next window, as the journal keeps it.

A held window's evidence (a step's, or the shadow phase's pairs) adds up with the next window's.
It is journaled with the decision that held it, in the same transaction, so a controller killed
between windows is replaced by one that judges with what the killed one had.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qlift.quality.judge import JudgeResult
from qlift.quality.registry import Answer as QualityAnswer
from qlift.quality.toolcalls import ToolCall
from qlift.rollout.check_types import WindowKind
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.shadow import Answer, Pair, ShadowEvidence
from qlift.rollout.stable_reads import StableReads
from qlift.serialize import to_jsonable

Held = Evidence | ShadowEvidence


def dump(ev: Held) -> tuple[WindowKind, str]:
    """(kind, JSON) of held evidence; the kind is journaled as its value ("shadow", "split")."""
    return (WindowKind.SHADOW if isinstance(ev, ShadowEvidence) else WindowKind.SPLIT), json.dumps(to_jsonable(ev))


def load(kind: str, text: str) -> Held:
    data = json.loads(text)
    return _shadow(data) if WindowKind(kind) is WindowKind.SHADOW else _evidence(data)


def dump_version(ev: VersionEvidence) -> str:
    return json.dumps(to_jsonable(ev))


def load_version(text: str) -> VersionEvidence:
    return _version(json.loads(text))


def _judged(d: dict[str, Any] | None) -> JudgeResult | None:
    return None if d is None else JudgeResult(**d)


def _version(d: dict[str, Any]) -> VersionEvidence:
    answers = d.pop("answers", None)
    ev = VersionEvidence(**d)
    if answers is not None:
        ev.answers = [QualityAnswer(a["request"], a["text"], a.get("other"),
                                    Path(a["refusal_patterns"]) if a.get("refusal_patterns") else None,
                                    a.get("finish_reason"), _calls(a.get("tool_calls")), a.get("completion_tokens"))
                      for a in answers]
    return ev


def _calls(raw: list[list[str | None]] | None) -> tuple[ToolCall, ...]:
    """Tool calls as the journal keeps them, (name, arguments) lists, back into pairs (older journals: none)."""
    return tuple((str(name), args) for name, args in raw or ())


def _evidence(d: dict[str, Any]) -> Evidence:
    stable, canary, judged = _version(d.pop("stable")), _version(d.pop("canary")), _judged(d.pop("judged", None))
    return Evidence(stable, canary, judged=judged, reads=StableReads.load(d.pop("reads", None)), **d)


def _side(d: dict[str, Any]) -> Answer:
    return Answer(**{**d, "tool_calls": _calls(d.get("tool_calls"))})


def _shadow(d: dict[str, Any]) -> ShadowEvidence:
    pairs = [Pair(p["seq"], p["request"], _side(p["primary"]), _side(p["shadow"]), p["path"]) for p in d.pop("pairs")]
    judged = _judged(d.pop("judged", None))
    return ShadowEvidence(pairs=pairs, judged=judged, reads=StableReads.load(d.pop("reads", None)), **d)
