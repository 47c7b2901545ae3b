"""The analysis decides as data (issue #53): ``Analysis.assess(policy, evidence, window)`` returns the rollout's
``Next``, which one ``commit`` writes. Where the shadow phase and the bake differ from a step, a named
``WindowPolicy`` field says how; each is tested here by flipping it on a step's policy."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from qlift.rollout import next_state
from qlift.rollout.analysis import Analysis, WindowState
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.journal import Journal, Rollout
from qlift.rollout.persist import commit
from qlift.rollout.spec import RolloutSpec, ShadowSpec
from qlift.rollout.states import Phase, State, StepOutcome
from qlift.rollout.webhook import WebhookAction
from qlift.rollout.windows import SHADOW_STEP, WindowPolicy

SPEC = RolloutSpec.model_validate({"stable": "s", "canary": "c", "router": "http://127.0.0.1:1", "steps": [10, 50, 100],
                                   "interval": 1, "bake": 2,
                                   "analysis": {"min_requests": 5, "max_inconclusive": 2, "intervals_per_step": 2}})


def version(name: str, n: int, errors: int = 0) -> VersionEvidence:
    return VersionEvidence(name, requests=n, errors=errors, latency_s=[0.5 + i * 0.001 for i in range(n)],
                           ttft_s=[0.1] * n, completion_tokens=[20.0] * n, finishes=n, length_finishes=0,
                           completions=n, completion_tokens_sum=20.0 * n, empty=0)


def window(canary: int = 40, stable: int = 160, errors: int = 0) -> Evidence:
    return Evidence(version("s", stable), version("c", canary, errors), 0.0, 1.0, "scripted")


def rollout(state: State = State.PROGRESSING, step: int = 0, holds: int = 0, passes: int = 0, errors: int = 0
            ) -> Rollout:
    return Rollout(1, "t", "t", state, "s", "c", SPEC.model_dump(mode="json"), step, holds, passes, "s", "", errors)


def assess(policy: WindowPolicy, ev: Evidence, r: Rollout) -> next_state.Next:
    return Analysis(SPEC).assess(policy, ev, WindowState(r))


STEP = Analysis(SPEC).windows.step


def test_a_passing_window_short_of_the_step_counts_a_pass_and_writes_no_state() -> None:
    nxt = assess(STEP, window(), rollout(holds=1))
    assert (nxt.phase, nxt.state, nxt.counters, nxt.weights) == (Phase.PASS, State.PROGRESSING,
                                                                 next_state.Counters(1, 1, 0), None)
    assert nxt.window is not None and nxt.window.step == 0 and nxt.window.carry is None


def test_the_last_passing_window_moves_to_the_next_step_with_its_weights() -> None:
    nxt = assess(STEP, window(), rollout(passes=1))
    assert nxt.phase == Phase.ADVANCE and nxt.position == 1 and nxt.webhook == WebhookAction.ADVANCE
    assert nxt.step == next_state.StepMove(StepOutcome.PASSED, (1, 50))
    assert nxt.weights == next_state.Weights(50, "step 2/3: canary 50%") and nxt.baseline is None


def test_moving_to_100_with_a_bake_keeps_the_stables_figures() -> None:
    nxt = assess(STEP, window(), rollout(step=1, passes=1))
    assert nxt.weights is not None and nxt.weights.canary == 100
    assert nxt.baseline is not None and nxt.baseline.requests == 160


def test_failing_errors_roll_back_to_the_stable() -> None:
    nxt = assess(STEP, window(errors=30), rollout())
    assert (nxt.phase, nxt.state, nxt.desired_version) == (Phase.ROLLBACK, State.ROLLED_BACK, "s")
    assert nxt.weights == next_state.Weights(0, "rollback") and nxt.step.finish == StepOutcome.ROLLED_BACK


def test_a_hold_carries_the_evidence_and_too_little_traffic_pauses_after_max_holds() -> None:
    held = assess(STEP, window(canary=2), rollout())
    assert held.phase == Phase.HOLD and held.window is not None and held.window.carry is not None
    assert held.counters == next_state.Counters(1, 0, 0)
    paused = assess(STEP, window(canary=1), rollout(holds=2))
    assert (paused.phase, paused.state) == (Phase.PAUSE, State.PAUSED) and "too little canary traffic" in paused.reason


def test_pass_resets_holds() -> None:
    policy = dataclasses.replace(STEP, pass_resets_holds=True)
    assert assess(STEP, window(), rollout(holds=2)).counters == next_state.Counters(2, 1, 0)
    assert assess(policy, window(), rollout(holds=2)).counters == next_state.Counters(0, 1, 0)


def test_exhausted_holds_follow_on_insufficient_whatever_held_them() -> None:
    policy = dataclasses.replace(STEP, exhausted_holds_follow_on_insufficient=True)
    nxt = assess(policy, window(canary=1), rollout(holds=2))
    assert nxt.state == State.PAUSED and "mirror a larger share" in nxt.reason


def test_kept_stable_is_never_added_up_with_held_windows() -> None:
    def later() -> Evidence:
        ev = window(canary=3)
        ev.stable = version("s", 160)  # the kept figures, as the bake's windows come with them
        return ev

    at = WindowState(rollout(), (0, window(canary=2)))
    plain = Analysis(SPEC).with_carry(STEP, at, later())
    kept = Analysis(SPEC).with_carry(dataclasses.replace(STEP, kept_stable=True), at, later())
    assert isinstance(plain, Evidence) and plain.stable.requests == 160 + 160
    assert isinstance(kept, Evidence) and kept.stable.requests == 160 and kept.canary.requests == 5


def test_passed_state_finish_and_webhook_say_where_a_passed_window_goes() -> None:
    policy = dataclasses.replace(STEP, passed_state=State.BAKED, next_step_on_pass=False,
                                 finish_on_pass=StepOutcome.PROMOTED, webhook_on_pass=WebhookAction.BAKED)
    nxt = assess(policy, window(), rollout(state=State.BAKING, step=2, passes=1))
    assert (nxt.state, nxt.webhook, nxt.desired_version, nxt.weights) == (State.BAKED, WebhookAction.BAKED, "c", None)
    assert nxt.step == next_state.StepMove(StepOutcome.PROMOTED) and nxt.position is None


def test_reason_texts_and_prefix() -> None:
    policy = dataclasses.replace(STEP, reason_prefix="shadow phase: ", pass_text="window {done}/{needed}: {reason}",
                                 passed_text="passed ({needed}): {reason}")
    assert assess(policy, window(), rollout()).reason.startswith("window 1/2: ")
    assert assess(policy, window(), rollout(passes=1)).reason.startswith("passed (2): ")
    assert assess(policy, window(errors=30), rollout()).reason.startswith("shadow phase: ")


def test_the_shadow_and_bake_policies_name_their_differences() -> None:
    w = Analysis(SPEC.model_copy(update={"shadow": ShadowSpec(percent=20)})).windows
    assert w.shadow is not None and w.bake is not None
    assert (w.shadow.pass_resets_holds, w.shadow.exhausted_holds_follow_on_insufficient, w.shadow.next_step_on_pass,
            w.shadow.journal_step) == (True, True, False, SHADOW_STEP)
    assert (w.bake.kept_stable, w.bake.passed_state, w.bake.webhook_on_pass) == (True, State.BAKED,
                                                                               WebhookAction.BAKED)
    assert not (w.step.pass_resets_holds or w.step.kept_stable) and w.step.next_step_on_pass


def test_one_commit_writes_a_next_or_nothing_when_the_rollout_moved(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.sqlite") as journal:
        r = journal.create(SPEC.model_dump(mode="json"), "s", "c")
        applied: list[dict[str, int]] = []
        nxt = assess(STEP, window(errors=30), r)
        stale = dataclasses.replace(r, state=State.PAUSED)
        assert not commit(journal, stale, nxt, applied.append) and applied == []
        assert commit(journal, r, nxt, applied.append) and applied == [{"s": 100, "c": 0}]
        after = journal.get(r.id)
        assert (after.state, after.desired_version) == (State.ROLLED_BACK, "s")
        history = journal.history(r.id)
        assert [w["action"] for w in history["windows"]] == ["rollback"]
        assert history["decisions"][-1]["reason"] == nxt.reason
