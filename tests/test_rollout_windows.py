"""One evidence counter, one window policy per kind, one sizing rule (issue #40): the shadow pairs and the
router's records are counted by the same rules, each window kind's needs come from the RolloutSpec once, and
the judge's sizing advice is the traffic rule's own text."""

from __future__ import annotations

import pytest

from qlift.rollout.check_types import WindowKind
from qlift.rollout.evidence import Evidence, VersionEvidence, from_request_records
from qlift.rollout.judge import judge
from qlift.rollout.shadow import Answer, Pair, ShadowEvidence
from qlift.rollout.sources import SHARED_SERVER_NOTE, Collector, _Noted, source_notes
from qlift.rollout.spec import AnalysisSpec, ShadowSpec, build_spec
from qlift.rollout.traffic import Cause, TrafficCounts, explain
from qlift.rollout.windows import BAKE_STEP, SHADOW_STEP, WindowPolicies, WindowRole
from qlift.router.wire import RequestRecord

ROUTER = {"stable": "s", "canary": "c", "router": "http://127.0.0.1:1"}

# (ok, status, stream, latency, ttft, tokens, finish): one attempt as either window kind sees it
ATTEMPTS = [(True, 200, True, 1.0, 0.2, 40, "stop"), (True, 200, False, 2.0, 2.0, 80, "length"),
            (True, 200, True, 0.5, 0.1, 0, "stop"), (False, 502, True, 0.1, None, None, None)]


def test_a_shadow_side_and_the_router_records_count_the_same_attempts_alike() -> None:
    records = [RequestRecord(seq=i, time=1.0, request_id=f"r{i}", backend="c", status=status, ok=ok, replayed=False,
                             stream=stream, latency_s=lat, ttfb_s=ttft, completion_tokens=tokens, finish_reason=finish,
                             reason=None if ok else "http_5xx")
               for i, (ok, status, stream, lat, ttft, tokens, finish) in enumerate(ATTEMPTS)]
    pairs = [Pair(i, {"stream": stream, "messages": [{"role": "user", "content": "hi"}]},
                  Answer("s", 200, True, 1.0, ttft_s=0.2, completion_tokens=40, finish_reason="stop"),
                  Answer("c", status, ok, lat, ttft_s=ttft, completion_tokens=tokens, finish_reason=finish))
             for i, (ok, status, stream, lat, ttft, tokens, finish) in enumerate(ATTEMPTS)]
    split = from_request_records("c", records).summary()
    shadow = ShadowEvidence("s", "c", pairs).side("shadow").summary()
    assert split.pop("sessions") == 0 and "sessions" not in shadow  # the shadow's copies carry no session key
    assert split == shadow
    assert (split["requests"], split["errors"], split["length_share"]) == (4, 1, pytest.approx(1 / 3))


def test_each_window_kind_takes_its_needs_from_the_spec_once() -> None:
    spec = build_spec({**ROUTER, "bake": 2, "interval": "20s", "shadow": {"percent": 20, "min_pairs": 7, "windows": 3},
                       "analysis": {"min_requests": 30, "intervals_per_step": 2, "max_inconclusive": 4}}, {})
    w = WindowPolicies.of(spec)
    assert w.shadow is not None and w.bake is not None
    assert (w.step.kind, w.step.min_count, w.step.passes, w.step.early_end, w.step.journal_step) == (
        WindowKind.SPLIT, 30, 2, True, None)
    assert (w.shadow.kind, w.shadow.min_count, w.shadow.passes, w.shadow.early_end, w.shadow.journal_step) == (
        WindowKind.SHADOW, 7, 3, False, SHADOW_STEP)
    assert (w.bake.role, w.bake.min_count, w.bake.passes, w.bake.early_end, w.bake.journal_step) == (
        WindowRole.BAKE, 30, 2, True, BAKE_STEP)
    assert {p.interval_s for p in (w.step, w.shadow, w.bake)} == {20.0} and {p.max_holds for p in (
        w.step, w.shadow, w.bake)} == {4}
    bare = WindowPolicies.of(build_spec(ROUTER, {}))
    assert bare.shadow is None and bare.bake is None


def test_a_shadow_window_needs_min_pairs_not_min_requests() -> None:
    pairs = [Pair(i, {"messages": [{"role": "user", "content": "hi"}]},
                  Answer("s", 200, True, 1.0, text="fine", completion_tokens=5, finish_reason="stop"),
                  Answer("c", 200, True, 1.0, text="fine", completion_tokens=5, finish_reason="stop"))
             for i in range(5)]
    a = AnalysisSpec(min_requests=100)
    held = judge(ShadowEvidence("s", "c", pairs), a, ShadowSpec(percent=20, min_pairs=6))
    assert held.insufficient and "5 shadow pairs < min_pairs 6" in held.reason
    enough = judge(ShadowEvidence("s", "c", pairs), a, ShadowSpec(percent=20, min_pairs=5))
    assert not enough.insufficient and "min_requests" not in enough.reason, enough.reason


def test_the_judge_sizing_advice_is_the_traffic_rule() -> None:
    ev = Evidence(VersionEvidence("s", requests=36, errors=0), VersionEvidence("c", requests=4, errors=0), 0.0, 30.0,
                  "router", weight=10)
    d = judge(ev, AnalysisSpec(min_requests=20))
    assert d.sizing is not None
    rule = explain(TrafficCounts(4, 36, 0.1, 30.0, 1, 20))
    assert rule.cause == Cause.VOLUME and rule.interval_needed == 150
    assert d.sizing.advice() == rule.text and f"({rule.text})" in d.reason


class _Plain:
    """A source without notes of its own (the router's, nginx's)."""

    name = "router"

    def begin(self) -> None:
        pass

    def collect(self) -> dict[str, VersionEvidence]:
        return {"s": VersionEvidence("s", requests=1), "c": VersionEvidence("c", requests=2)}

    def peek(self) -> None:
        return None


class _WithNotes(_Plain):
    def __init__(self) -> None:
        self.notes = ["no series for c"]


def test_a_window_carries_the_notes_a_source_declares() -> None:
    assert source_notes(_Plain()) == [] and source_notes(_WithNotes()) == ["no series for c"]
    assert source_notes(_Noted(_WithNotes(), SHARED_SERVER_NOTE)) == ["no series for c", SHARED_SERVER_NOTE]
    ev = Collector(_Noted(_Plain(), SHARED_SERVER_NOTE), "s", "c", None).collect()
    assert ev.notes == [SHARED_SERVER_NOTE] and (ev.stable.requests, ev.canary.requests) == (1, 2)


def test_an_nginx_log_line_is_counted_by_the_same_counter(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The access log's attempts go through EvidenceCounter too: what nginx can tell counts as the router's records
    do (a 5xx replayed on the other version is the first one's error), what it cannot tell stays None."""
    import json

    from qlift.rollout.nginx import AccessLogSource

    src = AccessLogSource(tmp_path, {"s": "http://127.0.0.1:9001", "c": "http://127.0.0.1:9002"})
    lines = [{"status": 200, "upstream_addr": "127.0.0.1:9002", "upstream_status": "200",
              "upstream_response_time": "1.000", "upstream_header_time": "0.200", "content_type": "text/event-stream"},
             {"status": 200, "upstream_addr": "127.0.0.1:9002, 127.0.0.1:9001", "upstream_status": "502, 200",
              "upstream_response_time": "0.100, 2.000", "upstream_header_time": "0.100, 2.000",
              "content_type": "application/json"}]
    src.path.parent.mkdir(parents=True)
    src.path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = src.collect()
    c, s = got["c"], got["s"]
    assert (c.requests, c.errors, c.latency_s, c.ttft_s) == (2, 1, [1.0], [0.2])
    assert (s.requests, s.errors, s.latency_s, s.ttft_s) == (1, 0, [2.0], [])  # not a stream: no TTFT
    assert (c.bad_answers, c.finishes, c.completions, c.empty, c.sessions, c.answers) == (None,) * 6
