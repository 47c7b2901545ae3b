"""What the live stages (serve, router, promote) are planned and run with, as typed objects handed down:

- ``LivePlan``: the release, its live stages, the models the file stages made, the servers' choices, the evals
  done; filled as the stages are keyed (each serve stage's model, each stage's key, the candidate's eval).
- ``LiveRun``: what the live stages of one run share as they start: the journal, the servers started (stopped when
  the run ends), their URLs and models' hashes by role, the router's URL and public model, and the admin tokens:
  of a router the release starts, and the caller's for a running one the file names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import JsonValue

from qlift.errors import BadInputError
from qlift.models.ref import ModelRef
from qlift.release.journal import ReleaseJournal
from qlift.release.live import Processes
from qlift.release.spec import Release, ServeStageOptions, Stage

if TYPE_CHECKING:
    from qlift.rollout.states import State


def rollout_journal(out: Path, run_id: int) -> Path:
    """One rollout journal per run: a run killed mid-promote left a rollout whose servers and router
    are gone; the next run starts them again and rolls out from the first step."""
    return out / f"rollout-{run_id}.sqlite"


def rollout_journals(out: Path) -> list[Path]:
    """The rollout journals of a release's runs (``rollout_journal``'s), newest first."""
    found = [(int(run), p) for p in out.glob("rollout-*.sqlite") if (run := p.stem.removeprefix("rollout-")).isdigit()]
    return [p for _, p in sorted(found, reverse=True)]


def rollout_state(result: dict[str, JsonValue]) -> State | None:
    """The final state of the rollout a promote stage's journaled result holds (None: it failed before it began)."""
    from qlift.rollout.states import State

    return State(str(result["state"])) if "state" in result else None


@dataclass(frozen=True)
class CheckedEval:
    """An eval stage done (run or cached): the model it evaluated, its report and its key."""

    candidate: str  # content hash of the evaluated model
    report: Path
    key: str


@dataclass
class LivePlan:
    release: Release
    stages: list[Stage]
    made: dict[str, ModelRef]  # the base and each model stage -> the model it made
    choices: dict[str, tuple[str, str]]  # serve stage -> (the model stage it serves here, why where it falls back)
    evals: list[CheckedEval]
    models: dict[str, ModelRef] = field(default_factory=dict)  # serve stage -> the model it serves
    keys: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    eval_report: Path | None = None  # the candidate's eval, whose gates promote checks
    eval_key: str | None = None

    def serve_keys(self) -> list[str]:
        return sorted(self.keys[name] for name in self.models)

    def candidate(self) -> ModelRef | None:
        """The model the candidate's server serves (None: no serve stage is the candidate)."""
        role = {s.name: s.opts(ServeStageOptions).role for s in self.stages if s.name in self.models}
        return next((m for name, m in self.models.items() if role[name] == "candidate"), None)

    def check_candidate_eval(self) -> None:
        """The last eval stage that evaluated the model the candidate serves; where evals ran but none of them
        did, promote could not check the candidate's gates: refused."""
        candidate = self.candidate()
        if candidate is None:
            return
        evals = [e for e in self.evals if e.candidate == candidate.content_hash]
        if self.evals and not evals:
            raise BadInputError(f"no eval stage evaluated the model the candidate serves ({candidate.base})",
                                path=self.release.file, field="stages",
                                hint="Add an eval stage whose input is that model, so promote can check its gates.")
        if evals:
            self.eval_report, self.eval_key = evals[-1].report, evals[-1].key


@dataclass
class LiveRun:
    """The typed context of one run's live stages: each stage's start reads what the ones before it set."""

    plan: LivePlan
    journal: ReleaseJournal
    run_id: int
    procs: Processes
    token: str
    echo: Callable[[str], None] = print
    urls: dict[str, str] = field(default_factory=dict)  # role -> its server's URL
    hashes: dict[str, str] = field(default_factory=dict)  # role -> the content hash of the model its server serves
    router_url: str = ""
    router_started: bool = False  # promote drives it with ``token``; a running router's token is the caller's
    public_model: str = "release"
    caller_token: str | None = None  # the caller's admin token of a running router (None: none given)

    def router_token(self) -> str | None:
        """The admin token promote drives the router with: the one the release started it with, else the
        caller's."""
        return self.token if self.router_started else self.caller_token
