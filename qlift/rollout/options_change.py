"""`promote start` on a rollout in progress, with options of its own: never dropped.

The options given (the flags and the -f file's fields: a spec's set fields) are compared with the journaled
spec. Those a rollout can take mid-way (the analysis limits, the interval, the webhook, the bake's windows,
the shadow phase's settings while it runs, the steps not reached yet) are applied: the journal's spec is
rewritten in the same transaction as one decision naming each change (``next_state.options_changed``), and a
running controller judges its next window with them. Those it cannot (the versions, the router and the data
plane, the evidence source, the eval gate, steps already started) are refused, each named, before anything
is written. docs/promote.md, "Changing a rollout's options", lists them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from qlift.errors import BadInputError, QliftError
from qlift.rollout import next_state
from qlift.rollout.aborts import spec_of
from qlift.rollout.journal import Journal, Rollout, journal_flag
from qlift.rollout.persist import commit
from qlift.rollout.spec import FLAG_FOR, RolloutSpec
from qlift.rollout.states import State

# Sections compared field by field (the rest are compared whole).
SECTIONS = ("analysis", "shadow", "prometheus", "nginx", "gateway", "inference_ext")

# Fields a rollout in progress cannot take, and why.
FIXED = {
    "stable": "the rollout's versions",
    "canary": "the rollout's versions",
    "router": "the router the rollout's weights live on",
    "data_plane": "where the rollout's weights live",
    "nginx": "the data plane's settings",
    "gateway": "the data plane's settings",
    "inference_ext": "the data plane's settings",
    "backends": "the versions' servers the evidence reads",
    "models": "the served model names the evidence reads",
    "provider": "the evidence source",
    "prometheus": "the evidence source",
    "vllm_metrics": "the evidence source",
    "eval_report": "the eval gate ran at start",
    "canary_model": "the eval gate ran at start",
    "canary_hash": "the eval gate ran at start",
}
SHADOW_PHASE_ONLY = ("percent", "windows", "min_pairs", "max_inflight")  # moot once the shadow phase passed


@dataclass(frozen=True)
class OptionChange:
    key: str  # the spec's dotted field
    old: Any
    new: Any
    refused: str | None = None  # why a rollout in progress cannot take it

    def line(self) -> str:
        if self.key == "shadow":  # the phase as a whole: named by its --shadow PERCENT
            return f"--shadow {shown('shadow.percent', (self.old or {}).get('percent'))} -> " \
                   f"{shown('shadow.percent', (self.new or {}).get('percent'))}"
        return f"{FLAG_FOR.get(self.key, self.key)} {shown(self.key, self.old)} -> {shown(self.key, self.new)}"


def shown(key: str, value: Any) -> str:
    """A value as its flag takes it: 20%, 30s, 10,50,100."""
    if value is None:
        return "none"
    if key in ("shadow.percent", "shadow.judge_split_percent"):
        return f"{value:g}%"
    if (key == "interval" or key.endswith("_s")) and isinstance(value, int | float):
        return f"{value:g}s"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value).lower() if isinstance(value, bool) else str(value)


def _given(new: dict[str, Any], old: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, old, new) of each given field whose value differs from the journal's."""
    out = []
    for key, value in new.items():
        before = old.get(key)
        if key in SECTIONS and isinstance(value, dict) and isinstance(before, dict):
            out += [(f"{key}.{sub}", before.get(sub), v) for sub, v in value.items() if v != before.get(sub)]
        elif value != before:
            out.append((key, before, value))
    return out


def _refusal(key: str, old: Any, new: Any, spec: RolloutSpec, r: Rollout, started: int) -> str | None:
    head, _, sub = key.partition(".")
    if head in FIXED:
        return FIXED[head]
    if key == "interval" and spec.provider == "prometheus":
        return "the Prometheus queries' $window is the interval the rollout started with"
    if key == "steps" and list(new[:started]) != list(old[:started]):
        return f"step(s) {shown(key, old[:started])} already started"
    if key == "bake" and (r.state == State.BAKED or (r.state == State.BAKING and not new)):
        return "the bake already passed" if r.state == State.BAKED else "the bake is running"
    if key == "shadow":
        return "a shadow phase runs before the first step: this rollout has none" if old is None else \
            "the rollout's shadow phase"
    if head == "shadow" and sub in SHADOW_PHASE_ONLY and started:
        return "the shadow phase already passed"
    return None


def option_changes(journal: Journal, r: Rollout, given: RolloutSpec) -> list[OptionChange]:
    """The options ``given`` (its set fields) that differ from rollout ``r``'s journaled spec."""
    spec = spec_of(r)
    started = len(journal.history(r.id)["steps"])  # steps whose weights were set
    found = _given(given.model_dump(mode="json", exclude_unset=True), spec.model_dump(mode="json"))
    return [OptionChange(key, old, new, _refusal(key, old, new, spec, r, started)) for key, old, new in found]


def _new_spec(r: Rollout, changes: list[OptionChange]) -> dict[str, Any]:
    data = spec_of(r).model_dump(mode="json")
    for c in changes:
        head, _, sub = c.key.partition(".")
        if sub:
            data[head] = {**(data.get(head) or {}), sub: c.new}
        else:
            data[head] = c.new
    try:
        return RolloutSpec.model_validate(data).model_dump(mode="json")
    except ValidationError as exc:
        err = exc.errors()[0]
        raise BadInputError(str(err["msg"]).removeprefix("Value error, "),
                            field=".".join(str(p) for p in err["loc"]) or None,
                            hint="With the rollout's other options these do not make a valid spec.") from None


def apply_options(journal: Journal, r: Rollout, given: RolloutSpec, *, resume_to: State | None = None) -> Rollout:
    """Rollout ``r`` with the options ``given`` that differ from its journal's applied (one decision naming
    each); ``resume_to``: a paused rollout's state to go back to with them. Refuses, writing nothing, when any
    of them cannot change mid-rollout. ``r`` as it is when none differ."""
    changes = option_changes(journal, r, given)
    if not changes:
        return r
    refused = [c for c in changes if c.refused is not None]
    flag = journal_flag(journal.path)
    if refused:
        raise BadInputError(
            f"rollout {r.id} in {journal.path} is in progress with other options that cannot change mid-rollout: "
            + "; ".join(f"{c.line()} ({c.refused})" for c in refused),
            hint=f"Leave them out to resume it as it is, or `qlift promote abort{flag}` it and start again with "
                 "the new ones")
    resumed = r.state == State.PAUSED and resume_to is not None
    nxt = next_state.options_changed(resume_to if resumed and resume_to else r.state, [c.line() for c in changes],
                                     _new_spec(r, changes), resumed=resumed)
    if not commit(journal, r, nxt):
        raise QliftError(f"rollout {r.id} changed meanwhile ({journal.get(r.id).state})",
                         hint=f"See `qlift promote status{flag}`, then try again.")
    return journal.get(r.id)
