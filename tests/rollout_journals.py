"""Rollout journals written by the real controller on a fake clock, for what reads a journal back
(`promote status`, `promote report`): a shadow phase, held and passing windows, a promotion, and a
rollback on looping answers. Every timestamp (windows, weight changes, decisions) is on the fake clock,
so a whole rollout of 30 s windows is journaled in well under a second of wall time."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from test_rollout_journal import MemoryPlane
from test_rollout_state import FakeClock

import qlift.rollout.journal as journal_module
from qlift.quality.registry import Answer as QualityAnswer
from qlift.rollout.controller import Controller, Pace
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.journal import Journal
from qlift.rollout.shadow import Answer, Pair, ShadowEvidence
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.states import State

LOOP = "Please hold on, please hold on, please hold on, please hold on, please hold on, please hold on."
PROMPT = "Where is my order A{:05d}? It was due yesterday."


def version(name: str, n: int, *, token_s: float, ttft_s: float, answer: str | None = None) -> VersionEvidence:
    """``n`` successful streamed answers of 20 tokens; ``answer`` (else a polite one) as every answer's text."""
    answers = [QualityAnswer({"messages": [{"role": "user", "content": PROMPT.format(i)}]},
                             answer or f"Your order A{i:05d} ships today; sorry for the wait.") for i in range(n)]
    return VersionEvidence(name, requests=n, errors=0, bad_answers=0,
                           latency_s=[ttft_s + 19 * token_s + i * 1e-4 for i in range(n)],
                           ttft_s=[ttft_s + i * 1e-4 for i in range(n)], completion_tokens=[20.0] * n,
                           token_latency_s=[token_s + i * 1e-5 for i in range(n)], finishes=n, length_finishes=0,
                           completions=n, completion_tokens_sum=20.0 * n, empty=0, answers=answers or None)


class ClockedEvidence:
    """One scripted (canary, stable) evidence a window, timed by the fake clock."""

    def __init__(self, clock: FakeClock, script: list[tuple[VersionEvidence, VersionEvidence]],
                 notes: list[str] | None = None) -> None:
        self.clock, self.script, self.notes, self.windows, self.started = clock, script, notes or [], 0, 0.0

    def begin(self) -> None:
        self.started = self.clock.now

    def peek(self) -> None:
        return None

    def collect(self) -> Evidence:
        canary, stable = self.script[min(self.windows, len(self.script) - 1)]
        self.windows += 1
        return Evidence(stable, canary, self.started, self.clock.now, "router", notes=list(self.notes))


class ClockedShadow:
    """The router's shadow pairs, scripted: ``counts[i]`` identical answer pairs in shadow window i."""

    def __init__(self, clock: FakeClock, counts: list[int]) -> None:
        self.clock, self.counts, self.windows, self.started = clock, counts, 0, 0.0

    def start(self, version: str, percent: float, max_inflight: int) -> dict[str, Any]:
        return {}

    def stop(self) -> None:
        pass

    def begin(self) -> None:
        self.started = self.clock.now

    def collect(self) -> ShadowEvidence:
        n = self.counts[min(self.windows, len(self.counts) - 1)]
        self.windows += 1
        ev = ShadowEvidence("s", "c", started_at=self.started, ended_at=self.clock.now)
        for i in range(n):
            text = f"Your order A{i:05d} ships today; sorry for the wait."
            req = {"stream": True, "messages": [{"role": "user", "content": PROMPT.format(i)}]}
            ev.pairs.append(Pair(i, req, Answer("s", 200, True, 1.0, ttft_s=0.10, text=text, finish_reason="stop",
                                                completion_tokens=20),
                                 Answer("c", 200, True, 1.1, ttft_s=0.11, text=text, finish_reason="stop",
                                        completion_tokens=20)))
        return ev


def spec(**kw: Any) -> RolloutSpec:
    base = {"stable": "s", "canary": "c", "router": "http://127.0.0.1:1", "interval": "30s", "steps": [10, 50, 100],
            "analysis": {"min_requests": 5, "max_inconclusive": 2}}
    return RolloutSpec.model_validate({**base, **kw})


@contextmanager
def fake_time(clock: FakeClock):  # type: ignore[no-untyped-def]
    """The journal's own timestamps (weight changes, decisions, steps) on the fake clock too."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(journal_module, "now_iso",
                   lambda: datetime.fromtimestamp(clock.now, UTC).isoformat(timespec="milliseconds"))
        yield


def run_rollout(path: Path, sp: RolloutSpec, script: list[tuple[VersionEvidence, VersionEvidence]], *,
                shadow_counts: list[int] | None = None, notes: list[str] | None = None) -> str:
    """Journal one whole rollout into ``path``; returns its final state."""
    clock = FakeClock()
    with fake_time(clock), Journal(path) as journal:
        first = State.SHADOWING if sp.shadow is not None else State.PROGRESSING
        r = journal.create(sp.model_dump(mode="json"), sp.stable, sp.canary, state=first)
        shadow = ClockedShadow(clock, shadow_counts or [20])
        ctl = Controller(journal, r.id, sp, MemoryPlane(), ClockedEvidence(clock, script, notes),  # type: ignore[arg-type]
                         pace=Pace(tick=0.5, sleep=clock.sleep, clock=clock.time), shadow_source=shadow)
        return ctl.run().state


def promoted(path: Path) -> str:
    """Shadow: a held window (6 pairs), then two passing; 10%: a held window (3 canary requests), then one
    that passes on the 3 + 8 requests; 50%: one passing window; promoted. The canary is ~1.2x slower."""
    fast = version("s", 40, token_s=0.050, ttft_s=0.100)
    script = [(version("c", 3, token_s=0.060, ttft_s=0.121), fast),
              (version("c", 8, token_s=0.060, ttft_s=0.121), fast),
              (version("c", 30, token_s=0.060, ttft_s=0.121), fast)]
    return run_rollout(path, spec(shadow={"percent": 20, "windows": 2, "min_pairs": 8}), script,
                       shadow_counts=[6, 12, 12], notes=["stable and canary share one server"])


def looped(path: Path) -> str:
    """10%: a window without canary traffic, then one that passes; at 50% every canary answer loops: rolled
    back, the loops kept as examples."""
    fast = version("s", 40, token_s=0.050, ttft_s=0.100)
    script = [(version("c", 0, token_s=0.055, ttft_s=0.105), fast),
              (version("c", 12, token_s=0.055, ttft_s=0.105), fast),
              (version("c", 30, token_s=0.055, ttft_s=0.105, answer=LOOP), fast)]
    return run_rollout(path, spec(), script)
