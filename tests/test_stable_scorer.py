"""The stable reads the canary: answers scored under the stable model through vLLM's prompt_logprobs, the
``stable_reads`` check on those scores, its place in the window's family, and a scorer that is down or slow.

A small fake vLLM (one token per character, ChatML-like template, log-probabilities by character class) stands in
for the server where a real one won't fail on demand; the last test reads real answers with SmolLM2."""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from aiohttp import web
from faults import ThreadedApp

from qlift.quality.registry import Answer
from qlift.quality.scorer import ScorerSettings, answer_score, messages_of, score_answers
from qlift.rollout import carry
from qlift.rollout.check_types import CheckStatus, Window, WindowKind
from qlift.rollout.checks import family
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.judge import judge
from qlift.rollout.read_checks import check_stable_reads
from qlift.rollout.spec import AnalysisSpec, RolloutSpec
from qlift.rollout.stable_reads import CANARY, STABLE, ReadAnswer, StableReader, StableReads, make_reader
from qlift.rollout.stats import wilcoxon_greater

MOJIBAKE = "Le remboursement a été émis, à bientôt.".encode().decode("cp1252", errors="replace")


class FakeVllm(ThreadedApp):
    """/v1/models, /tokenize and /v1/completions with prompt_logprobs, as vLLM answers them: a token per character
    (its code point), ASCII at -0.5, CJK at -1, Latin-1 letters and U+FFFD (mojibake) at -14."""

    shutdown_timeout_s = 0.05

    def __init__(self, *, status: int = 200, stall_s: float = 0.0, owned_by: str = "vllm", logprobs: bool = True
                 ) -> None:
        self.status, self.stall_s, self.owned_by, self.logprobs = status, stall_s, owned_by, logprobs
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[str | None] = []
        super().__init__()

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/completions", self._completions)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "smol", "owned_by": self.owned_by}]})

    async def _gate(self, request: web.Request) -> dict[str, Any] | web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(request.headers.get("Authorization"))
        if self.stall_s:
            await asyncio.sleep(self.stall_s)
        if self.status != 200:
            return web.json_response({"error": {"message": "down"}}, status=self.status)
        return dict(body)

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await self._gate(request)
        if isinstance(body, web.Response):
            return body
        ids: list[int] = []
        msgs = body["messages"]
        for i, m in enumerate(msgs):
            ids += [1, *map(ord, m["role"]), 10, *map(ord, m["content"])]
            if not (body.get("continue_final_message") and i == len(msgs) - 1):
                ids += [2, 10]
        if body.get("add_generation_prompt"):
            ids += [1, *map(ord, "assistant"), 10]
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": 4096})

    @staticmethod
    def logprob(token: int) -> float:
        return -0.5 if token < 128 else -14.0 if token < 0x300 or token == 0xFFFD else -1.0

    async def _completions(self, request: web.Request) -> web.Response:
        body = await self._gate(request)
        if isinstance(body, web.Response):
            return body
        plp = [None] + [{str(t): {"logprob": self.logprob(t), "rank": 1}} for t in body["prompt"][1:]]
        return web.json_response({"choices": [{"text": "", **({"prompt_logprobs": plp} if self.logprobs else {})}]})


def _reads(canary: list[tuple[float, float, str]], stable: list[tuple[float, float, str]],
           paired: bool = True) -> StableReads:
    """Reads from (nll, low share, prompt script) per answer; paired: the i-th of each side share a prompt."""
    out = [ReadAnswer(side, nll, low, 20, script, i if paired else None, f"prompt {i}", f"answer {i}")
           for side, rows in ((CANARY, canary), (STABLE, stable)) for i, (nll, low, script) in enumerate(rows)]
    return StableReads("smol", out, len(out))


def _stable(n: int, seed: int = 0, script: str = "Latin") -> list[tuple[float, float, str]]:
    rng = random.Random(seed)
    return [(rng.uniform(1.0, 2.0), 0.0, script) for _ in range(n)]


def test_an_answer_is_scored_on_its_own_tokens_after_the_servers_chat_template(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    assert messages_of({"prompt": "退款？", "system": "Be brief."}) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "退款？"}]
    shadow = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert messages_of(shadow) == [{"role": "user", "content": "hi"}]
    s = answer_score([-1.0, -13.0], 7)
    assert (s.nll, s.low_share, s.tokens, s.prompt_tokens) == (7.0, 0.5, 2, 7)
    monkeypatch.setenv("QLIFT_STABLE_READS_API_KEY", "sk-secret-key-123")
    clean, cjk = "Your refund was issued.", "退款已经处理。"
    with FakeVllm() as fake:
        run = score_answers([(messages_of({"prompt": "refund?"}), clean), (messages_of({"prompt": "退款？"}), cjk),
                             (messages_of({"prompt": "refund?"}), MOJIBAKE), (messages_of({"prompt": "x"}), ""),
                             (messages_of({"prompt": "x"}), "a" * 400)],
                            ScorerSettings(fake.url, "smol", max_answer_tokens=256))
    a, b, garbled, empty, long = run.scores
    assert a is not None and a.nll == pytest.approx(0.5) and a.tokens == len(clean) and a.low_share == 0
    assert b is not None and b.nll == pytest.approx(1.0) and b.tokens == len(cjk)
    assert garbled is not None and garbled.low_share > 0.05 and garbled.nll > 1.0
    assert empty is None and "1 unscored: empty answer" in run.notes
    assert long is not None and long.tokens == 256
    full = [x for x in fake.bodies if x.get("continue_final_message")]
    assert full and all(x["add_generation_prompt"] is False and x["messages"][-1]["role"] == "assistant" for x in full)
    assert all(x["prompt_logprobs"] == 0 and x["max_tokens"] == 1 for x in fake.bodies if "prompt" in x)
    assert set(fake.headers) == {"Bearer sk-secret-key-123"} and "sk-secret" not in repr(run)


@pytest.mark.parametrize("fault", ["down", "stalled"])
def test_a_scorer_down_or_slow_leaves_answers_unscored_in_bounded_time_and_the_check_inconclusive(fault: str) -> None:
    fake = FakeVllm(status=500) if fault == "down" else FakeVllm(stall_s=30)
    items = [(messages_of({"prompt": f"q{i}"}), MOJIBAKE) for i in range(6)]
    with fake:
        t0 = time.monotonic()
        run = score_answers(items, ScorerSettings(fake.url, "smol", timeout_s=0.3, deadline_s=0.5))
        took = time.monotonic() - t0
    assert took < 2 and run.scored == 0 and run.down == 6 and run.cannot_read is None
    reads = StableReads("smol", [], 12, notes=run.notes)
    r = check_stable_reads(reads, WindowKind.SHADOW, AnalysisSpec(), 0.05)
    assert r is not None and r.status == CheckStatus.INCONCLUSIVE and "never a failure" in r.detail, r
    assert ("HTTP 500" if fault == "down" else "deadline") in r.detail


def test_the_signed_rank_test_is_exact_for_small_samples_and_agrees_with_its_approximation() -> None:
    assert wilcoxon_greater([0.3] * 8).p_value == pytest.approx(1 / 256)
    assert wilcoxon_greater([1, 1, 1, -1]).p_value == pytest.approx(5 / 16)  # tied magnitudes: signs alone count
    assert wilcoxon_greater([0, 0]).p_value == 1.0 and wilcoxon_greater([-1, -2, -3]).p_value == 1.0
    rng = random.Random(3)
    diffs = [rng.gauss(0.3, 1) for _ in range(25)]
    exact = wilcoxon_greater(diffs).p_value
    import qlift.rollout.stats as rc

    approx = pytest.MonkeyPatch()
    approx.setattr(rc, "EXACT_UP_TO", 0)
    try:
        assert rc.wilcoxon_greater(diffs).p_value == pytest.approx(exact, abs=0.01)
    finally:
        approx.undo()


def test_a_garbled_canary_fails_paired_and_unpaired_and_a_different_style_within_the_margin_passes() -> None:
    a = AnalysisSpec()
    stable = _stable(24)
    garbled = [(nll + 2.0, 0.15, s) for nll, _, s in stable]
    styled = [(nll + a.max_nll_increase * 0.6, 0.0, s) for nll, _, s in stable]  # wordier, same content
    for kind, paired in ((WindowKind.SHADOW, True), (WindowKind.SPLIT, False)):
        bad = check_stable_reads(_reads(garbled, stable, paired), kind, a, 0.05 / 16)
        assert bad is not None and bad.status == CheckStatus.FAIL, bad
        assert bad.test == ("wilcoxon" if paired else "mann-whitney") and bad.p_value is not None
        assert bad.canary is not None and bad.stable is not None and bad.canary > bad.stable + 1.5
        assert len(bad.examples) == 3 and "NLL" in str(bad.examples[0]["evidence"])
        ok = check_stable_reads(_reads(styled, stable, paired), kind, a, 0.05 / 16)
        assert ok is not None and ok.status == CheckStatus.PASS and not ok.examples, ok
        assert "mean NLL" in ok.detail and "log-probability -12" in ok.detail


def test_garbled_tokens_in_a_long_answer_fail_on_their_share_where_the_mean_moves_little() -> None:
    a = AnalysisSpec()
    stable = _stable(24, seed=1)
    canary = [(nll + a.max_nll_increase * 0.5, 0.08, s) for nll, _, s in stable]
    r = check_stable_reads(_reads(canary, stable), WindowKind.SHADOW, a, 0.05 / 16)
    assert r is not None and r.status == CheckStatus.FAIL and "share of answer tokens" in r.detail, r


def test_past_the_margin_on_few_answers_holds_and_one_language_worse_fails_there() -> None:
    a = AnalysisSpec()
    few = check_stable_reads(_reads([(5.0, 0.0, "Latin")] * 3, _stable(3)), WindowKind.SHADOW, a, 0.05)
    assert few is not None and few.status == CheckStatus.INCONCLUSIVE and "min_samples" in few.detail
    stable = _stable(40, seed=2) + _stable(16, seed=3, script="Han")
    canary = [(nll + (2.5 if s == "Han" else -0.1), 0.0, s) for nll, _, s in stable]
    r = check_stable_reads(_reads(canary, stable, paired=False), WindowKind.SPLIT, a, 0.05 / 16)
    assert r is not None and r.status == CheckStatus.FAIL and r.detail.split("; ")[1].startswith("on Han prompts")
    assert check_stable_reads(None, WindowKind.SPLIT, a, 0.05) is None
    skipped = check_stable_reads(StableReads(skipped="not vLLM"), WindowKind.SPLIT, a, 0.05)
    assert skipped is not None and skipped.status == CheckStatus.SKIPPED and skipped.detail == "not vLLM"


def _evidence(reads: StableReads | None) -> Evidence:
    answers = [Answer({"prompt": f"Where is order A{i}?"}, f"Order A{i} ships today.") for i in range(30)]
    c = VersionEvidence("canary", 30, errors=0, latency_s=[1.0] * 30, answers=answers)
    s = VersionEvidence("stable", 60, errors=0, latency_s=[1.0] * 60, answers=answers * 2)
    return Evidence(s, c, 0.0, 30.0, "router", reads=reads)


def test_the_check_joins_the_windows_family_where_it_runs_and_its_reads_are_carried() -> None:
    a = AnalysisSpec()
    reads = _reads([(nll + 2.0, 0.1, s) for nll, _, s in _stable(30)], _stable(30), paired=False)

    def window(r: StableReads | None) -> Window:
        ev = _evidence(r)
        return Window(WindowKind.SPLIT, ev.canary, ev.stable, 20, reads=ev.reads)

    assert family(window(reads)) == family(window(None)) + 1
    assert family(window(StableReads(skipped="the stable's server is not vLLM"))) == family(window(None))
    d = judge(_evidence(reads), a)
    check = {c.name: c for c in d.checks}["stable_reads"]
    assert d.action == "rollback" and check.status == CheckStatus.FAIL, d.reason
    assert "stable_reads" not in {c.name for c in judge(_evidence(None), a).checks}
    held = carry.load(*carry.dump(_evidence(reads)))
    assert isinstance(held, Evidence) and held.reads == reads
    both = held.merged(_evidence(reads))
    assert both.reads is not None and len(both.reads.answers) == 2 * len(reads.answers)
    assert both.reads.sampled == 2 * reads.sampled


class Plane:
    def __init__(self, url: str) -> None:
        self.url = url

    def backend_urls(self) -> dict[str, str]:
        return {"stable": self.url, "canary": "http://127.0.0.1:9"}

    def backend_models(self) -> dict[str, str]:
        return {"stable": "smol"}


def _spec(**analysis: Any) -> RolloutSpec:
    return RolloutSpec(stable="stable", canary="canary", router="http://127.0.0.1:9", analysis=analysis)


def test_the_reader_finds_the_stables_vllm_and_skips_anything_else() -> None:
    assert make_reader(_spec(stable_reads="off"), Plane("")) is None  # type: ignore[arg-type]
    ev = _evidence(None)
    ev.canary.answers = [Answer({"prompt": "Where is my order?"}, MOJIBAKE)] * 6
    with FakeVllm() as fake:
        reader = StableReader(_spec(stable_reads_samples=4), Plane(fake.url))  # type: ignore[arg-type]
        reads = reader.read_split(ev)
        assert reads.skipped is None and reads.model == "smol" and reads.sampled == 8 and len(reads.answers) == 8
        assert {x.side for x in reads.answers} == {CANARY, STABLE}
        assert all(x.low_share > 0 for x in reads.side(CANARY)) and all(x.low_share == 0 for x in reads.side(STABLE))
        gets = len(fake.bodies)
        reader.read_split(ev)
        assert len(fake.bodies) == 2 * gets  # /v1/models is asked once a rollout (not a body: only posts count)
        named = StableReader(_spec(stable_reads=f"{fake.url}/v1#smol"), Plane("http://nowhere:1"))  # type: ignore
        assert named.read_split(ev).model == "smol"
    with FakeVllm(owned_by="someone-else") as other:
        skipped = StableReader(_spec(), Plane(other.url)).read_split(ev)  # type: ignore[arg-type]
    assert skipped.skipped is not None and "not a vLLM server" in skipped.skipped and not other.bodies
    hidden = StableReader(_spec(), Plane("http://***@127.0.0.1:9")).read_split(ev)  # type: ignore[arg-type]
    assert hidden.skipped is not None and "credentials" in hidden.skipped
    nowhere = StableReader(_spec(), Plane("http://127.0.0.1:9")).read_split(ev)  # type: ignore[arg-type]
    assert nowhere.skipped is not None and "cannot tell whether it is a vLLM server" in nowhere.skipped
    with FakeVllm(logprobs=False) as mute:  # says it is vLLM, gives no prompt_logprobs: skipped, not asked again
        reader = StableReader(_spec(stable_reads_samples=4), Plane(mute.url))  # type: ignore[arg-type]
        first = reader.read_split(ev)
        calls = len(mute.bodies)
        assert first.skipped is not None and "no prompt_logprobs" in first.skipped and calls
        assert reader.read_split(ev).skipped is not None and len(mute.bodies) == calls
    with FakeVllm() as flaky:  # known to be vLLM, then failing: unscored, inconclusive, never a failure
        reader = StableReader(_spec(stable_reads_samples=4), Plane(flaky.url))  # type: ignore[arg-type]
        assert reader.read_split(ev).answers
        flaky.status = 503
        down = reader.read_split(ev)
    assert down.skipped is None and down.sampled == 8 and not down.answers and "HTTP 503" in down.notes[0]
    r = check_stable_reads(down, WindowKind.SPLIT, AnalysisSpec(), 0.05)
    assert r is not None and r.status == CheckStatus.INCONCLUSIVE
    no_answers = StableReader(_spec(), Plane("http://127.0.0.1:9"))  # type: ignore[arg-type]
    ev.canary.answers = None
    assert no_answers.read_split(ev).skipped is not None


@pytest.mark.vllm
def test_smollm2_reads_a_garbled_canary_as_significantly_worse_and_a_resample_as_healthy(vllm_server: Any) -> None:
    """Real answers of SmolLM2 (English and Chinese prompts), read by SmolLM2: the same answers misdecoded
    fail the paired check at a window's level; the model's own answers sampled at temperature 0.7 do not."""
    import httpx

    from qlift.rollout.checks import tested_checks

    url, model = vllm_server.base_url, vllm_server.served_model_name
    prompts = [f"In one sentence, what is {w}?" for w in ("rain", "a bicycle", "bread", "a library", "the moon",
                                                          "a river", "snow")]
    prompts += [f"用一句话解释什么是{w}。" for w in ("雨", "自行车", "面包", "图书馆", "月亮", "河流", "雪")]

    def answer(p: str, temperature: float) -> str:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": model, "messages": [{"role": "user", "content": p}], "max_tokens": 24,
            "temperature": temperature, "seed": 7})
        return str(r.json()["choices"][0]["message"]["content"])

    with ThreadPoolExecutor(4) as pool:  # the server batches them
        stable = list(pool.map(lambda p: answer(p, 0.0), prompts))
        resampled = list(pool.map(lambda p: answer(p, 0.7), prompts))
    garbled = [t.encode().decode("cp1252", errors="replace") if not t.isascii() else
               t.replace(" ", "Ġ").replace("\n", "Ċ") for t in stable]  # misdecoded: mojibake, byte-level BPE
    settings = ScorerSettings(url, model, timeout_s=60, deadline_s=120)
    scored = {name: score_answers([(messages_of({"prompt": p}), t) for p, t in zip(prompts, texts, strict=True)],
                                  settings).scores
              for name, texts in (("stable", stable), ("resampled", resampled), ("garbled", garbled))}
    a = AnalysisSpec()
    alpha = a.alpha / (tested_checks() + 1)  # a split window that sees answers, the stable's reads in its family

    def reads(canary: str) -> StableReads:
        rows = [ReadAnswer(side, s.nll, s.low_share, s.tokens, "han" if i >= 7 else "latin", i)
                for side, name in ((CANARY, canary), (STABLE, "stable"))
                for i, s in enumerate(scored[name]) if s is not None]
        return StableReads(model, rows, 2 * len(prompts))

    bad = check_stable_reads(reads("garbled"), WindowKind.SHADOW, a, alpha)
    assert bad is not None and bad.status == CheckStatus.FAIL, bad.detail
    assert bad.canary is not None and bad.stable is not None and bad.canary > bad.stable + a.max_nll_increase
    ok = check_stable_reads(reads("resampled"), WindowKind.SHADOW, a, alpha)
    assert ok is not None and ok.status != CheckStatus.FAIL, ok.detail


class ReadingBackend:
    """An eval backend that scores a reference as FakeVllm would (ASCII -0.5 a character, Latin-1 -12)."""

    name = "reading"

    def numerics(self, model: Any) -> str:
        return ""

    def identify(self, model: Any) -> None:
        model.served_identity = "reading:" + model.name

    def generate(self, model: Any, requests: list[Any], sampling: Any, on_result: Any = None) -> list[Any]:
        from qlift.eval.generation import Generation

        return [Generation("x", 1, 0.0, ref_logprob=sum(FakeVllm.logprob(ord(c)) for c in r.reference or ""),
                           ref_tokens=len(r.reference or "")) for r in requests]


def test_eval_scores_both_models_answers_under_the_baseline_with_a_bootstrap_interval() -> None:
    from pathlib import Path

    from qlift.errors import BadInputError
    from qlift.eval.baseline_reads import baseline_reads, describe
    from qlift.eval.generation import EvalModel, Generation, GenerationCache, Request
    from qlift.eval.options import EvalOptions

    with pytest.raises(BadInputError, match="baseline"):
        EvalOptions(prompts=Path("p.jsonl"), score_with_baseline=True)
    requests = [Request([{"role": "user", "content": f"q{i}"}], None, None) for i in range(12)]
    answers = {"baseline": [Generation(f"Answer number {i}.", 4, 0.1) for i in range(12)],
               "candidate": [Generation(MOJIBAKE, 9, 0.1) for _ in range(11)] + [Generation("", 0, 0.1)]}
    r = baseline_reads(EvalModel("baseline", "base"), requests, answers, ReadingBackend(), GenerationCache(None),
                       resamples=200, seed=0)
    assert r["n"] == 11 and r["unscored"] == 1 and r["baseline_nll"] == pytest.approx(0.5)
    assert r["candidate_nll"] > 1.5 and r["ci95"][0] > 0.5 and r["candidate_less_likely"] == 11
    assert f"candidate {r['candidate_nll']:.3f} vs baseline 0.500" in describe(r) and "over 11 prompts" in describe(r)
