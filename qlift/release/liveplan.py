"""The live stages' plan and run: serve, router and promote, keyed and journaled together.

Each live stage goes through its row of the stage table (``qlift.release.livestages``): the servers are keyed
first (the others' keys are made of theirs), then the rest; they run in file order. Each is journaled
``running`` when it starts and ``done`` or ``failed`` when it ends, so ``qlift release status`` shows how long
each took and, for promote, where its rollout journal is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlift.errors import BadInputError, QliftError
from qlift.models.ref import ModelRef
from qlift.release import live
from qlift.release.journal import StageStatus
from qlift.release.report import Action, StageReport, first_line, stage_key
from qlift.release.spec import ServeStageOptions, Stage
from qlift.release.stages import TABLE, LiveDoor

if TYPE_CHECKING:
    from qlift.release.pipeline import Pipeline
    from qlift.rollout.states import State


def rollout_journal(out: Path, run_id: int) -> Path:
    """One rollout journal per run: a run killed mid-promote left a rollout whose servers and router
    are gone; the next run starts them again and rolls out from the first step."""
    return out / f"rollout-{run_id}.sqlite"


def rollout_state(result: dict[str, Any]) -> State | None:
    """The final state of the rollout a promote stage's journaled result holds (None: it failed before it began)."""
    from qlift.rollout.states import State

    return State(result["state"]) if "state" in result else None


def _door(stage: Stage) -> LiveDoor:
    door = TABLE[stage.kind].live
    assert door is not None, f"{stage.kind} is not a live stage"
    return door


@dataclass
class LivePlan:
    pipeline: Pipeline
    stages: list[Stage]
    models: dict[str, ModelRef] = field(default_factory=dict)  # serve stage -> the model it serves
    keys: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    eval_report: Path | None = None  # the candidate's eval, whose gates promote checks
    eval_key: str | None = None

    @classmethod
    def of(cls, p: Pipeline, stages: list[Stage]) -> LivePlan:
        plan = cls(p, stages)
        servers = [s for s in stages if TABLE[s.kind].serves]
        for s in servers:
            plan.keys[s.name] = stage_key(s.kind, s.options, _door(s).key_inputs(plan, s))
        plan._candidate_eval()
        for s in stages:
            if s not in servers:
                plan.keys[s.name] = stage_key(s.kind, s.options, _door(s).key_inputs(plan, s))
        return plan

    def serve_keys(self) -> list[str]:
        return sorted(self.keys[name] for name in self.models)

    def candidate(self) -> ModelRef | None:
        """The model the candidate's server serves (None: no serve stage is the candidate)."""
        role = {s.name: s.opts(ServeStageOptions).role for s in self.stages if s.name in self.models}
        return next((m for name, m in self.models.items() if role[name] == "candidate"), None)

    def _candidate_eval(self) -> None:
        """The last eval stage that evaluated the model the candidate serves; where evals ran but none of them
        did, promote could not check the candidate's gates: refused."""
        p, candidate = self.pipeline, self.candidate()
        if candidate is None:
            return
        evals = [e for e in p.evals.values() if e.candidate == candidate.content_hash]
        if p.evals and not evals:
            raise BadInputError(f"no eval stage evaluated the model the candidate serves ({candidate.base})",
                                path=p.release.file, field="stages",
                                hint="Add an eval stage whose input is that model, so promote can check its gates.")
        if evals:
            self.eval_report, self.eval_key = evals[-1].report, evals[-1].key

    def run(self) -> None:
        p = self.pipeline
        run = LiveRun(self, live.Processes(p.journal, p.run_id), live.new_router_token())
        try:
            for s in self.stages:
                t0 = time.monotonic()
                key = self.keys[s.name]
                p.journal.begin(s.name, key, "")
                result = _door(s).start(run, s)
                p.journal.end(s.name, key, StageStatus.DONE, result=result)
                p._report(StageReport(s.name, s.kind, Action.RAN, self.notes.get(s.name, ""), key,
                                      seconds=round(time.monotonic() - t0, 2), result=result))
        except BaseException as exc:
            row = p.journal.stage(s.name, key)
            if row is not None and row.status is StageStatus.RUNNING:  # promote journals its failure with its result
                p.journal.end(s.name, key, StageStatus.FAILED, result={"error": first_line(exc)})
            if isinstance(exc, QliftError | KeyboardInterrupt):
                p._report(StageReport(s.name, s.kind, Action.FAILED, first_line(exc), key,
                                      seconds=round(time.monotonic() - t0, 2)))
            raise
        finally:
            run.procs.stop()


@dataclass
class LiveRun:
    """What the live stages of one run share as they start: the servers started (stopped when the run ends), the
    servers' URLs and models' hashes by role, the router's URL and public model, and the admin token of a router
    the release starts."""

    plan: LivePlan
    procs: live.Processes
    token: str
    urls: dict[str, str] = field(default_factory=dict)  # role -> its server's URL
    hashes: dict[str, str] = field(default_factory=dict)  # role -> the content hash of the model its server serves
    router_url: str = ""
    router_started: bool = False  # promote drives it with ``token``; a running router's token is the caller's
    public_model: str = "release"
