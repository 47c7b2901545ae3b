"""Checks and data planes as data, and the judge's LLM-specific verdicts: too little traffic, garbage
answers, TTFT of streamed requests only, 'goes quiet' against a stable cut at max_tokens. Evidence is
folded from the router's own request records (its wire schema), recorded ones where the meaning of a
check depends on a real model (tests/recorded/)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, get_args

import click
import pytest
from click.testing import CliRunner

from qlift.cli.options import click_options
from qlift.errors import BadInputError
from qlift.quality.registry import ANSWER_METRICS
from qlift.rollout.checks import BY_NAME, CHECKS, WindowKind, argo_metrics, describe
from qlift.rollout.dataplane import make_data_plane as make_plane
from qlift.rollout.evidence import Evidence, from_request_records
from qlift.rollout.judge import TESTED_CHECKS, check_alpha, early_failures, judge
from qlift.rollout.planes import PLANES
from qlift.rollout.prometheus import PRESETS
from qlift.rollout.spec import AnalysisSpec, RolloutSpec, build_spec, spec_option_fields, spec_overrides
from qlift.rollout.stats import quantile
from qlift.router.client import RequestRecord
from qlift.router.wire import AnswerRecord

RECORDED = Path(__file__).parent / "recorded" / "tickets-vs-base.json"


def record(backend: str, seq: int, *, ok: bool = True, status: int = 200, stream: bool = True,
           latency: float | None = None,
           ttfb: float | None = 0.2, tokens: int | None = 40, finish: str | None = "stop",
           reason: str | None = None) -> RequestRecord:
    if latency is None:  # 30 ms a token after a 0.2 s first token
        latency = 0.2 + 0.03 * (tokens or 0) * (1 + 0.1 * ((seq * 7919) % 10) / 10)
    return RequestRecord(seq=seq, time=1000.0 + seq, request_id=f"r{seq}", backend=backend, status=status, ok=ok,
                         replayed=False, stream=stream, latency_s=latency, ttfb_s=ttfb if ok else None,
                         completion_tokens=tokens if ok else None, finish_reason=finish if ok else None,
                         reason=reason)


def evidence(stable: list[RequestRecord], canary: list[RequestRecord], *, seconds: float = 30.0,
             weight: int | None = None) -> Evidence:
    return Evidence(from_request_records("stable", stable), from_request_records("canary", canary), 0.0, seconds,
                    "router", weight=weight)


# -- the registries ---------------------------------------------------------------------------


def test_every_check_is_one_entry_the_judge_argo_and_status_read() -> None:
    a = AnalysisSpec()
    for c in CHECKS:
        assert all(f in AnalysisSpec.model_fields for f in c.limits), c.name
    # a split window runs every check that applies to split windows, but the judge model's (it has no verdicts) and
    # the stable's reads (no stable server read its answers)
    split = [c.name for c in CHECKS if WindowKind.SPLIT in c.applies
             and c.name not in ("tpot", "judge", "stable_reads")]
    # the 6 operational checks and one a registry entry of qlift.quality (the answer checks)
    assert TESTED_CHECKS == sum(BY_NAME[n].tested for n in split) == 6 + len(ANSWER_METRICS)
    assert check_alpha(a) == pytest.approx(a.alpha / (6 + len(ANSWER_METRICS)))
    rng = random.Random(0)
    ev = evidence([record("stable", i, latency=rng.uniform(1, 2)) for i in range(60)],
                  [record("canary", i, latency=rng.uniform(1, 2)) for i in range(30)])
    assert judge(ev, a).action == "advance"
    assert [c.name for c in judge(ev, a).checks] == split
    assert [d["name"] for d in describe(a)] == split
    # the pair checks are entries too: the shadow phase's alone, the judge model's in both kinds of window
    assert {c.name for c in CHECKS if c.applies == {WindowKind.SHADOW}} == {"json_valid", "agreement"}
    assert BY_NAME["judge"].applies == set(WindowKind) and BY_NAME["tpot"].applies == {WindowKind.SPLIT}
    assert describe(a)[1]["limits"] == {"max_error_rate": a.max_error_rate}
    metrics = argo_metrics(PRESETS["router"], a, "30s")
    assert {m.check for m in metrics} <= set(BY_NAME) and len({m.name for m in metrics}) == len(metrics)


def test_data_planes_are_one_table() -> None:
    choices = get_args(RolloutSpec.model_fields["data_plane"].annotation)
    assert set(choices) == set(PLANES)
    from qlift.rollout.sources import SOURCES

    for p in PLANES.values():
        assert p.prometheus_preset in PRESETS and p.evidence in SOURCES
        assert p.section is None or p.section in RolloutSpec.model_fields


def test_the_nginx_plane_gets_the_nginx_preset_and_plane(tmp_path: Path) -> None:
    spec = build_spec({"stable": "s", "canary": "c", "data_plane": "nginx", "nginx": {"prefix": str(tmp_path)},
                       "backends": {"s": "http://127.0.0.1:1", "c": "http://127.0.0.1:2"}, "provider": "prometheus",
                       "prometheus": {"url": "http://127.0.0.1:9"}}, {})
    assert spec.prometheus is not None and spec.prometheus.preset == "nginx"
    assert make_plane(spec, router_token=None).kind == "nginx"
    explicit = build_spec({**spec.model_dump(mode="json"), "prometheus": {"url": "http://x:9", "preset": "vllm"}}, {})
    assert explicit.prometheus is not None and explicit.prometheus.preset == "vllm"


def test_every_limit_is_a_flag_generated_from_the_spec() -> None:
    got: dict[str, Any] = {}

    @click.command()
    @click_options(spec_option_fields("analysis", "shadow"))
    def cmd(**kw: Any) -> None:
        got.update(spec_overrides(kw))
        assert not kw

    runner = CliRunner()
    help_text = runner.invoke(cmd, ["--help"]).output
    for field in AnalysisSpec.model_fields:
        assert "--" + field.replace("_", "-") in help_text
    assert "[pause|rollback]" in help_text and "--shadow-windows" in help_text
    r = runner.invoke(cmd, ["--min-requests", "5", "--min-tokens-ratio", "0.2", "--on-insufficient", "rollback",
                            "--shadow-windows", "3"])
    assert r.exit_code == 0, r.output
    spec = build_spec({"stable": "s", "canary": "c", "router": "http://127.0.0.1:1"}, got)
    assert (spec.analysis.min_requests, spec.analysis.min_tokens_ratio, spec.analysis.on_insufficient) == (
        5, 0.2, "rollback")
    assert spec.shadow is not None and spec.shadow.windows == 3
    shadowed = build_spec({"stable": "s", "canary": "c", "router": "http://127.0.0.1:1"}, {"shadow.percent": "20%"})
    assert shadowed.shadow is not None and shadowed.shadow.percent == 20
    with pytest.raises(BadInputError) as err:
        build_spec({"stable": "s", "canary": "c", "router": "http://127.0.0.1:1"}, {"shadow.percent": "150%"})
    assert err.value.field == "--shadow"
    assert runner.invoke(cmd, ["--on-insufficient", "never"]).exit_code == 2  # choices come from the Literal
    with pytest.raises(BadInputError) as err:
        build_spec({"stable": "s", "canary": "c", "router": "http://127.0.0.1:1"}, {"analysis.alpha": 2.0})
    assert err.value.field == "--alpha"


# -- the judge on LLM traffic --------------------------------------------------------------------


def test_too_little_traffic_is_insufficient_with_sizing_not_a_rollback() -> None:
    """The README's start at 10% under light load: 4 canary requests in a 30 s window."""
    ev = evidence([record("stable", i) for i in range(36)], [record("canary", i) for i in range(4)], weight=10)
    d = judge(ev, AnalysisSpec())
    assert (d.action, d.verdict) == ("hold", "insufficient") and d.insufficient
    assert d.sizing is not None
    assert d.sizing.canary_share == pytest.approx(0.10) and d.sizing.requests_per_s == pytest.approx(40 / 30)
    assert d.sizing.needed_interval_s == pytest.approx(20 / (0.1 * 40 / 30))  # 150 s
    assert "--interval >= 150s" in d.reason and "--min-requests" in d.reason
    passed = judge(evidence([record("stable", i) for i in range(60)], [record("canary", i) for i in range(30)]),
                   AnalysisSpec())
    assert passed.verdict == "pass" and passed.sizing is None


@pytest.mark.parametrize("reason", ["bad_body", "no_choices", "no_done"])
def test_garbage_answers_roll_back_in_the_first_window(reason: str) -> None:
    """HTTP 200s that are no completion, as the router records them: errors, below min_requests too."""
    stable = [record("stable", i) for i in range(40)]
    canary = [record("canary", i, ok=False, reason=reason) for i in range(4)]
    d = judge(evidence(stable, canary), AnalysisSpec())
    assert d.action == "rollback" and d.verdict == "fail", d.reason
    err = next(c for c in d.checks if c.name == "error_rate")
    assert err.status == "fail" and "4 of them unparseable or empty answers" in err.detail
    assert from_request_records("canary", canary).bad_answers == 4


def test_the_evidence_knows_every_reason_the_router_gives_a_garbage_answer() -> None:
    from qlift.rollout.evidence import BAD_ANSWER_REASONS
    from qlift.router.proxy import BAD_ANSWER

    assert set(BAD_ANSWER) == set(BAD_ANSWER_REASONS)


def test_empty_answers_roll_back_before_min_requests() -> None:
    stable = [record("stable", i) for i in range(40)]
    canary = [record("canary", i, tokens=0) for i in range(6)]
    d = judge(evidence(stable, canary), AnalysisSpec())
    assert d.action == "rollback" and {c.name for c in d.checks if c.status == "fail"} >= {"empty_completions"}
    # a window in progress ends as soon as this is significant: the controller peeks with early_failures
    assert [c.name for c in early_failures(evidence(stable, canary), AnalysisSpec())] == ["empty_completions"]
    assert early_failures(evidence(stable, stable[:6]), AnalysisSpec()) == []


def test_ttft_is_judged_on_streamed_requests_only() -> None:
    """Streamed TTFT equal (4.2 s); the canary drew more non-streamed requests, whose first byte is the
    whole answer (~12 s). Pooled, the ratio read ~2.9x and the canary was held."""
    rng = random.Random(3)

    def answers(backend: str, streamed_share: float, n: int) -> list[RequestRecord]:
        out = []
        for i in range(n):
            stream = rng.random() < streamed_share
            e2e = rng.uniform(10, 14)
            out.append(record(backend, i, stream=stream, latency=e2e, ttfb=rng.uniform(3.8, 4.6) if stream else e2e,
                              tokens=60))
        return out

    ev = evidence(answers("stable", 0.8, 80), answers("canary", 0.2, 40))
    d = judge(ev, AnalysisSpec())
    ttft = next(c for c in d.checks if c.name == "ttft")
    assert ttft.status == "pass" and ttft.ratio is not None and 0.8 < ttft.ratio < 1.25, ttft.detail
    assert len(ev.canary.ttft_s) < len(ev.canary.latency_s)
    assert d.action == "advance", d.reason


def test_goes_quiet_is_relative_to_a_stable_cut_at_max_tokens() -> None:
    rng = random.Random(5)
    rambling = [record("stable", i, tokens=64, finish="length" if rng.random() < 0.89 else "stop") for i in range(60)]
    short_json = [record("canary", i, tokens=rng.randint(22, 30)) for i in range(40)]
    d = judge(evidence(rambling, short_json), AnalysisSpec())
    tokens = next(c for c in d.checks if c.name == "completion_tokens")
    assert tokens.status == "pass" and "stable cut at max_tokens" in tokens.detail, tokens.detail
    assert d.action == "advance", d.reason
    # The same short answers against a stable that answers in full: the canary goes quiet.
    full = [record("stable", i, tokens=rng.randint(60, 68)) for i in range(60)]
    quiet = judge(evidence(full, short_json), AnalysisSpec())
    assert quiet.action == "rollback" and "goes quiet" in quiet.reason


SHAPES = {  # a support desk's kinds of request: (prompt, system, response_format, answer tokens of the stable)
    "json": ("Classify this ticket: refund for order A0042.", None, {"type": "json_object"}, 5),
    "en": ("My order A0042 never arrived. Can I cancel it?", "You are a support agent.", None, 47),
    "zh": ("我的订单 A0042 到货时已经损坏了，请帮我退款。", None, None, 54),
}


def answered(backend: str, seq: int, kind: str, *, scale: float = 1.0) -> RequestRecord:
    """A record whose answer was sampled, ``kind``'s stable length times ``scale`` (a token or two of noise)."""
    prompt, system, fmt, tokens = SHAPES[kind]
    n = max(1, round(tokens * scale) + seq % 3 - 1)
    return record(backend, seq, tokens=n).model_copy(update={"answer": AnswerRecord(
        prompt=prompt, text="word " * n, system=system, response_format=fmt)})


def test_answer_lengths_are_compared_on_the_same_kind_of_request() -> None:
    """A window's sample of a mixed desk is chance: a healthy canary that drew mostly the 5-token JSON requests
    is held to the stable's JSON answers, not to the pooled mean, and one short on every kind still goes quiet."""
    stable = [answered("stable", i, ("json", "json", "en", "zh", "en")[i % 5]) for i in range(60)]
    drew_json = [answered("canary", i, "json") for i in range(10)] + [
        answered("canary", 10, "en", scale=0.7), answered("canary", 11, "zh")]
    tokens = {c.name: c for c in judge(evidence(stable, drew_json), AnalysisSpec()).checks}["completion_tokens"]
    assert tokens.status == "pass" and "on the same request shapes (12 answers, 3 shapes)" in tokens.detail, \
        tokens.detail
    assert tokens.ratio is not None and 0.9 < tokens.ratio < 1.0, tokens.detail
    # the pooled means of the same window (a source without answers) read it as silence
    unseen = [r.model_copy(update={"answer": None}) for r in drew_json]
    pooled = judge(evidence([r.model_copy(update={"answer": None}) for r in stable], unseen), AnalysisSpec())
    assert pooled.action == "rollback" and "goes quiet" in pooled.reason, pooled.reason
    quiet = [answered("canary", i, ("json", "en", "zh")[i % 3], scale=0.3) for i in range(12)]
    d = judge(evidence(stable, quiet), AnalysisSpec())
    tokens = {c.name: c for c in d.checks}["completion_tokens"]
    assert d.action == "rollback" and tokens.status == "fail", d.reason
    assert "goes quiet" in tokens.detail and "on the same request shapes" in tokens.detail, tokens.detail
    # a canary whose answers fall in shapes the stable never answered is compared pooled
    elsewhere = [record("canary", i, tokens=40).model_copy(update={"answer": AnswerRecord(
        prompt=f"Как отменить заказ A00{i:02d}?", text="слово " * 40)}) for i in range(12)]
    tokens = {c.name: c for c in judge(evidence(stable, elsewhere), AnalysisSpec()).checks}["completion_tokens"]
    assert "request shapes" not in tokens.detail and tokens.status == "pass", tokens.detail


def test_rambles_means_cut_at_max_tokens_more_often_than_the_stable() -> None:
    stable = [record("stable", i, tokens=64, finish="length" if i % 10 == 0 else "stop") for i in range(60)]
    rambling = [record("canary", i, tokens=64, finish="length") for i in range(30)]
    d = judge(evidence(stable, rambling), AnalysisSpec())
    assert d.action == "rollback" and "finish_length" in d.reason
    both_cut = [record("stable", i, tokens=64, finish="length") for i in range(60)]
    assert judge(evidence(both_cut, rambling), AnalysisSpec()).action == "advance"


@pytest.mark.skipif(not RECORDED.exists(), reason="run tests/recorded/record_tickets.py")
def test_the_json_fine_tune_against_its_base_recorded() -> None:
    """examples/adapter (short JSON by design) against SmolLM2, 50/50, real router records."""
    data = json.loads(RECORDED.read_text())
    recs = [RequestRecord.model_validate(r) for r in data["requests"]]
    meta = data["meta"]
    ev = Evidence(from_request_records(meta["stable"], [r for r in recs if r.backend == meta["stable"]]),
                  from_request_records(meta["canary"], [r for r in recs if r.backend == meta["canary"]]),
                  meta["split"]["started_at"], meta["split"]["ended_at"], "router", weight=50)
    d = judge(ev, AnalysisSpec())
    checks = {c.name: c for c in d.checks}
    assert d.action == "advance", d.reason
    # the base rambles to max_tokens (87% cut when recorded), the fine-tune stops after ~33 tokens of JSON
    assert ev.stable.length_share is not None and ev.stable.length_share > 0.5
    tokens = checks["completion_tokens"]
    assert tokens.status == "pass" and "stable cut at max_tokens" in tokens.detail
    # the fine-tune drew more non-streamed requests: their first byte pooled with streamed TTFT read 2.4x
    pooled = {b: quantile([r.ttfb_s for r in recs if r.backend == b and r.ttfb_s is not None], 0.5)
              for b in (meta["stable"], meta["canary"])}
    assert pooled[meta["canary"]] / pooled[meta["stable"]] > AnalysisSpec().max_ttft_ratio  # type: ignore[operator]
    ttft = checks["ttft"]
    assert ttft.status == "pass" and ttft.ratio is not None and ttft.ratio <= AnalysisSpec().max_ttft_ratio


# -- garbage answers through the real router ------------------------------------------------------


class GarbageBackend:
    """Answers every completion with HTTP 200 that is no completion: ``mode`` text (not JSON), nochoices
    (a JSON error object), or nodone (an SSE stream that stops without [DONE])."""

    def __init__(self, mode: str) -> None:
        import asyncio

        from qlift.vllm.process import free_port

        self.mode, self.port = mode, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        if self.mode == "text":
            return web.Response(text="<html>upstream maintenance</html>", content_type="text/html")
        if self.mode == "nochoices" or not body.get("stream"):
            return web.json_response({"object": "error", "message": "model overloaded"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"id": "x", "model": "m", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write_eof()
        return resp

    def __enter__(self) -> GarbageBackend:
        import threading

        from aiohttp import web

        async def setup() -> None:
            app = web.Application()
            app.router.add_post("/v1/chat/completions", self._chat)
            app.router.add_get("/v1/models", lambda r: web.json_response({"data": [{"id": "m"}]}))
            app.router.add_get("/health", lambda r: web.Response(text=""))
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

        self._loop.run_until_complete(setup())
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.mark.parametrize(("mode", "stream"), [("text", False), ("nochoices", False), ("nodone", True)])
def test_a_canary_answering_200_garbage_is_rolled_back_in_its_first_window(tmp_path: Path, mode: str,
                                                                           stream: bool) -> None:
    """Real router, real HTTP: the router records each garbage 200 as a failed request with its reason;
    the first window's evidence (well below min_requests) already rolls the canary back."""
    from faults import RouterProcess, TinyBackend, run_load

    from qlift.rollout.sources import RouterSource

    with TinyBackend("m", tokens=8) as stable, GarbageBackend(mode) as garbage, RouterProcess(
            "--backend", f"stable={stable.url}#m", "--backend", f"canary={garbage.url}#m", "--weight", "stable=50",
            "--weight", "canary=50", "--public-model", "m", log_path=tmp_path / "router.log", token="t") as router:
        source = RouterSource(router.url, "t", ["stable", "canary"])
        source.begin()
        run_load(router.url, "m", requests=16, concurrency=2, stream=stream, max_tokens=8, timeout_s=60)
        got = source.collect()
    ev = Evidence(got["stable"], got["canary"], 0.0, 10.0, "router", weight=50)
    assert 0 < ev.canary.requests < AnalysisSpec().min_requests
    assert ev.canary.bad_answers == ev.canary.errors == ev.canary.requests, ev.canary.summary()
    d = judge(ev, AnalysisSpec())
    assert d.action == "rollback" and d.verdict == "fail" and "unparseable or empty answers" in d.reason, d.reason
