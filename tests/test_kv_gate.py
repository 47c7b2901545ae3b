"""FP8 KV cache only where an eval gate passed: the gate index that `qlift eval` writes and that
`qlift serve --recipe auto` reads (dry runs on SmolLM2; the real FP8-KV eval is benchmarks/gpu/gates_gpu.sh)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from qlift.eval.generation import EvalModel
from qlift.gates.index import index_dir, records, write_record
from qlift.models.ref import ModelRef, hash_memo
from qlift.serve.plan import DTYPE_BYTES


def _record(content_hash: str, *, passed: bool, date: str, kv: str | None = "fp8") -> dict[str, Any]:
    return {
        "content_hash": content_hash, "candidate": "/m/fp8", "engine_args": {"kv_cache_dtype": kv} if kv else {},
        "baseline": "/m/bf16", "baseline_hash": "sha256:" + "b" * 64, "baseline_engine_args": {}, "passed": passed,
        "date": date, "report": f"/reports/{date}/report.json", "prompts": "tickets.jsonl", "examples": 42,
        "backend": "vllm",
        "gates": [{"expr": "rougeL >= baseline - 0.02", "passed": passed, "value": 0.41 if passed else 0.30,
                   "threshold": 0.39, "baseline": 0.41}],
    }


def _dry_run(run_cli, model: Path, *args: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    res = run_cli("serve", model, *args, "--dry-run", "--json")
    assert res.exit_code == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout)
    out["kv"] = yaml.safe_load(out["config"]).get("kv-cache-dtype")
    out["kv_notes"] = [n for n in out["notes"] if "FP8 KV" in n]
    return out


def test_recipe_auto_turns_fp8_kv_on_only_where_the_newest_gate_report_passed(run_cli, smollm2_dir: Path) -> None:  # type: ignore[no-untyped-def]
    h = ModelRef.of(smollm2_dir.resolve(), memo=hash_memo()).content_hash

    none = _dry_run(run_cli, smollm2_dir, "--recipe", "auto")  # no report: off, and how to get one
    assert none["kv"] is None and len(none["kv_notes"]) == 1
    assert none["kv_notes"][0].startswith("FP8 KV cache off: no eval gate report against a baseline")
    assert f"qlift eval {smollm2_dir} --baseline BASELINE" in none["kv_notes"][0]
    assert "--set kv_cache_dtype=fp8 --gate" in none["kv_notes"][0]

    write_record(_record(h, passed=True, date="2026-12-01T10:00:00+00:00"))
    write_record(_record(h, passed=False, date="2026-12-01T09:00:00+00:00", kv=None))  # bf16 KV: not about FP8
    write_record(_record("sha256:" + "c" * 64, passed=False, date="2026-12-02T00:00:00+00:00"))  # another model
    absolute = _record(h, passed=True, date="2026-12-03T00:00:00+00:00")
    absolute["gates"] = [{**absolute["gates"][0], "expr": "rougeL >= 0"}]
    write_record(absolute)  # newest, but it never compared with the baseline: says nothing about FP8 KV
    on = _dry_run(run_cli, smollm2_dir, "--recipe", "auto")
    assert on["kv"] == "fp8" and on["plan"]["kv_cache_dtype"] == "fp8"
    assert on["kv_notes"][0].startswith("FP8 KV cache on (kv_cache_dtype=fp8): eval gate report "
                                        "/reports/2026-12-01T10:00:00+00:00/report.json of 2026-12-01T10:00:00+00:00")
    assert "rougeL >= baseline - 0.02 (0.41 vs 0.39)" in on["kv_notes"][0] and h[7:19] in on["kv_notes"][0]
    # FP8 KV stores one byte per element where the model's dtype stores two (bfloat16) or, on a CPU
    # without bf16 units where auto serves float32, four; the plan counts it
    element_bytes = DTYPE_BYTES[none["plan"]["dtype"]]
    assert none["plan"]["kv_cache_dtype"] in ("auto", none["plan"]["dtype"])
    assert on["plan"]["kv_bytes_per_token"] * element_bytes == none["plan"]["kv_bytes_per_token"]

    # A --set or a named recipe chooses for itself: no rule, no note.
    for args in (("--recipe", "auto", "--set", "kv-cache-dtype=auto"), ("--recipe", "cpu")):
        mine = _dry_run(run_cli, smollm2_dir, *args)
        assert mine["kv"] in (None, "auto") and mine["kv_notes"] == []

    write_record(_record(h, passed=False, date="2026-12-02T10:00:00+00:00"))  # a later failing report wins
    off = _dry_run(run_cli, smollm2_dir, "--recipe", "auto")
    assert off["kv"] is None
    assert "/reports/2026-12-02T10:00:00+00:00/report.json" in off["kv_notes"][0]
    assert off["kv_notes"][0].startswith("FP8 KV cache off: the newest eval gate report with FP8 KV")
    assert off["kv_notes"][0].endswith("failed: rougeL >= baseline - 0.02 (0.3 vs 0.39)")
    assert [r["date"][:10] for r in records(h)] == ["2026-12-01", "2026-12-01", "2026-12-02", "2026-12-03"]

    (index_dir() / h.removeprefix("sha256:") / "broken.json").write_text("{", encoding="utf-8")
    assert len(records(h)) == 4  # an unreadable record is skipped, not fatal


def test_eval_records_gated_reports_and_refuses_engine_sets_without_vllm(  # type: ignore[no-untyped-def]
        run_cli, tiny_qwen2_tied: Path, tiny_qwen2_untied: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "two.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Count to {i}:", "reference": "1 2 3"}) + "\n"
                               for i in (2, 3)), encoding="utf-8")
    args = ["eval", tiny_qwen2_untied, "--baseline", tiny_qwen2_tied, "--prompts", prompts, "--backend", "transformers",
            "--max-tokens", "4", "--bootstrap", "100", "--metrics", "rougeL"]
    bad = run_cli(*args, "--set", "kv_cache_dtype=fp8")
    assert bad.exit_code == 2 and "--set configures the vllm backend" in bad.stderr
    assert run_cli(*args, "--report", tmp_path / "ungated").exit_code == 0
    r = run_cli(*args, "--gate", "rougeL >= 0", "--report", tmp_path / "rep", "--json")
    assert r.exit_code == 0, r.stderr
    h = json.loads(r.stdout)["candidate"]["content_hash"]
    [rec] = records(h)  # the gated report only
    assert rec["passed"] and rec["engine_args"] == {} and rec["report"] == str((tmp_path / "rep/report.json").resolve())
    assert rec["gates"][0]["expr"] == "rougeL >= 0" and rec["baseline"] == str(tiny_qwen2_tied)


def test_an_fp8_kv_candidate_has_its_own_cache_identity(smollm2_dir: Path) -> None:
    ref = ModelRef.of(smollm2_dir, memo=hash_memo())
    plain, fp8 = EvalModel("baseline", "m", ref=ref), EvalModel("candidate", "m", ref=ref)
    fp8.engine_args = {"kv_cache_dtype": "fp8"}
    assert plain.cache_id == ref.content_hash and fp8.cache_id not in (None, plain.cache_id)


def test_plan_hashes_the_model_only_where_some_fp8_kv_report_exists(run_cli, tiny_qwen2_tied: Path,  # type: ignore[no-untyped-def]
                                                                    tmp_path: Path) -> None:
    import hashlib
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_qwen2_tied, model)
    (model / "qlift.json").unlink(missing_ok=True)  # hand-made: hashing reads every file and remembers it
    remembered = hash_memo() / (hashlib.sha256(str(model.resolve()).encode()).hexdigest()[:32] + ".json")

    def kv_note() -> str:
        r = run_cli("plan", model, "--recipe", "auto", "--json")
        assert r.exit_code == 0, r.stderr
        return next(n for n in json.loads(r.stdout)["notes"] if "FP8 KV" in n)

    # No FP8-KV report for any checkpoint: off without reading the weights.
    assert kv_note().startswith("FP8 KV cache off: no eval gate report against a baseline with kv_cache_dtype=fp8 "
                                "for this checkpoint; to allow it: qlift eval")
    assert not remembered.exists()
    write_record(_record("sha256:" + "c" * 64, passed=True, date="2026-12-02T00:00:00+00:00"))  # another model's
    h = ModelRef.of(model.resolve()).content_hash
    assert f"for this checkpoint (sha256:{h[7:19]}); to allow it" in kv_note() and remembered.is_file()
