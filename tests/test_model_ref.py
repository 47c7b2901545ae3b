"""ModelRef, what a model version is, as every stage names it: eval's report, serve's run record,
the router's backend entry, the rollout spec's eval gate (no vLLM)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qlift.models.ref import AdapterRef, ModelRef, dir_hash

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "examples" / "prompts" / "smoke.jsonl"


@pytest.fixture(autouse=True)
def _eval_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_EVAL_CACHE", str(tmp_path / "eval-cache"))


def _dir(path: Path, payload: bytes) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(payload)
    return path


def test_plain_dir_hash_is_the_lineage_hash_with_or_without_memo(tmp_path: Path) -> None:
    from qlift.lineage import describe_input

    d = _dir(tmp_path / "m", b"x" * 100)
    ref = ModelRef.of(d)
    assert ref.content_hash == describe_input("candidate", d)[0].content_hash == dir_hash(d)
    assert ModelRef.of(d, memo=tmp_path / "memo").content_hash == ref.content_hash
    assert ref.adapters == () and ref.short == ref.content_hash.removeprefix("sha256:")[:12]


def test_adapters_change_the_hash_in_content_name_and_order(tmp_path: Path) -> None:
    base = _dir(tmp_path / "base", b"b")
    a, b = _dir(tmp_path / "a", b"a"), _dir(tmp_path / "b", b"b2")
    plain = ModelRef.of(base).content_hash
    one = ModelRef.of(base, [AdapterRef(name="a", path=a)]).content_hash
    assert one != plain
    assert ModelRef.of(base, [AdapterRef(name="renamed", path=a)]).content_hash != one
    ab = ModelRef.of(base, [AdapterRef(name="a", path=a), AdapterRef(name="b", path=b)]).content_hash
    ba = ModelRef.of(base, [AdapterRef(name="b", path=b), AdapterRef(name="a", path=a)]).content_hash
    assert len({plain, one, ab, ba}) == 4
    (a / "model.safetensors").write_bytes(b"changed")
    assert ModelRef.of(base, [AdapterRef(name="a", path=a)]).content_hash != one


def test_eval_report_candidate_hash_is_the_model_ref(tmp_path: Path, run_cli, tiny_qwen2_tied: Path) -> None:
    model = tmp_path / "hand-made"  # no qlift.json: eval hashes the files (and remembers them)
    shutil.copytree(tiny_qwen2_tied, model, ignore=shutil.ignore_patterns("qlift.json"))
    rep = tmp_path / "rep"
    r = run_cli("eval", model, "--prompts", SMOKE, "--backend", "transformers", "--max-tokens", "2",
                "--bootstrap", "100", "--report", rep)
    assert r.exit_code == 0, r.output
    report = json.loads((rep / "report.json").read_text())
    assert report["candidate"]["content_hash"] == ModelRef.of(model).content_hash
    # the report keeps its shape: the EvalModel's ref stays out of it
    assert set(report["candidate"]) == {"role", "name", "path", "content_hash", "endpoint", "served_identity"}
