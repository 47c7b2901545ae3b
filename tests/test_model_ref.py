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


def _eval(run_cli, model: Path, rep: Path, gate: str = "length >= 0") -> dict:  # type: ignore[no-untyped-def,type-arg]
    r = run_cli("eval", model, "--prompts", SMOKE, "--backend", "transformers", "--max-tokens", "2",
                "--bootstrap", "100", "--metrics", "length", "--gate", gate, "--report", rep)
    assert r.exit_code in (0, 10), r.output
    return json.loads((rep / "report.json").read_text())  # type: ignore[no-any-return]


def test_eval_report_candidate_hash_is_the_model_ref(tmp_path: Path, run_cli, tiny_qwen2_tied: Path) -> None:  # type: ignore[no-untyped-def]
    model = tmp_path / "hand-made"  # no qlift.json: eval hashes the files (and remembers them)
    shutil.copytree(tiny_qwen2_tied, model, ignore=shutil.ignore_patterns("qlift.json"))
    report = _eval(run_cli, model, tmp_path / "rep")
    assert report["candidate"]["content_hash"] == ModelRef.of(model).content_hash
    # the report keeps its shape: the EvalModel's ref stays out of it
    assert set(report["candidate"]) == {"role", "name", "path", "content_hash", "endpoint", "served_identity",
                                        "engine_args"}


def test_eval_gate_matches_the_spec_canary_hash(tmp_path: Path, run_cli, tiny_qwen2_untied: Path,  # type: ignore[no-untyped-def]
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from faults import RouterProcess, TinyBackend

    from qlift.errors import GateFailedError
    from qlift.rollout.api import _eval_gate
    from qlift.rollout.evalgate import check_eval_report
    from qlift.rollout.spec import RolloutSpec
    from qlift.router.client import RouterClient

    _eval(run_cli, tiny_qwen2_untied, tmp_path / "pass")
    _eval(run_cli, tiny_qwen2_untied, tmp_path / "fail", gate="length >= 1000")
    ref = ModelRef.of(tiny_qwen2_untied)
    other = "sha256:" + "0" * 64
    assert check_eval_report(tmp_path / "pass", canary_hash=ref.content_hash)["content_hash"] == ref.content_hash
    with pytest.raises(GateFailedError, match="is not the model"):
        check_eval_report(tmp_path / "pass", canary_hash=other)
    with pytest.raises(GateFailedError, match="did not pass"):
        check_eval_report(tmp_path / "fail", canary_hash=ref.content_hash)
    # The hash comes first: no server is asked which dir it serves (this one is not even running).
    spec = RolloutSpec(stable="stable", canary="canary", router="http://127.0.0.1:9", eval_report=tmp_path / "pass",
                       canary_hash=ref.content_hash)
    assert _eval_gate(spec, {"canary": "http://127.0.0.1:9"}) is not None

    token = "model-ref-token"
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", token)
    with TinyBackend("m-stable") as a, TinyBackend("m-canary") as b:
        router = RouterProcess("--backend", f"stable={a.url}@m-stable", "--backend", f"canary={b.url}@m-canary",
                               "--weight", "stable=100", "--weight", "canary=0", "--public-model", "pub",
                               log_path=tmp_path / "router.log", token=token).start()
        try:
            spec_file = tmp_path / "rollout.yaml"
            spec_file.write_text(f"eval_report: {tmp_path / 'pass'}\ncanary_hash: '{other}'\n")
            r = run_cli("promote", "start", "-f", spec_file, "--router", router.url, "--stable", "stable",
                        "--canary", "canary", "--interval", "1s", "--journal", tmp_path / "j.sqlite", "--json")
            assert r.exit_code == 10 and "is not the model" in r.stderr, r.output
            assert RouterClient(router.url, token).state().weights == {"stable": 100, "canary": 0}
        finally:
            router.stop()


def test_serve_dry_run_carries_the_model_ref(run_cli, tiny_qwen2_tied: Path, tiny_lora_tied: Path) -> None:  # type: ignore[no-untyped-def]
    import os

    plain = json.loads(run_cli("serve", tiny_qwen2_tied, "--recipe", "cpu", "--dry-run", "--json").stdout)
    assert plain["model_ref"] == {"base": str(tiny_qwen2_tied.resolve()), "adapters": [],
                                  "content_hash": ModelRef.of(tiny_qwen2_tied).content_hash}
    res = run_cli("serve", tiny_qwen2_tied, "--recipe", "cpu", "--lora", f"tickets={tiny_lora_tied}",
                  "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    lora = json.loads(res.stdout)["model_ref"]
    want = ModelRef.of(tiny_qwen2_tied, [AdapterRef(name="tickets", path=tiny_lora_tied)])
    assert lora["adapters"] == [{"name": "tickets", "path": str(tiny_lora_tied.resolve())}]
    assert lora["content_hash"] == want.content_hash != plain["model_ref"]["content_hash"]
    human = run_cli("serve", tiny_qwen2_tied, "--recipe", "cpu", "--lora", f"tickets={tiny_lora_tied}",
                    "--dry-run").stdout
    assert f"# model version {want.content_hash} (+ adapter tickets)" in human
    assert not (Path(os.environ["QLIFT_HOME"]) / "runs").exists()  # a dry run writes nothing
    # A launch writes the same into RUN_DIR/model.json and its --json ready line (test_serve.py, vLLM).


def test_router_backend_entry_carries_the_model_hash(tmp_path: Path, tiny_qwen2_tied: Path) -> None:
    from faults import RouterProcess, TinyBackend

    h = ModelRef.of(tiny_qwen2_tied).content_hash
    with TinyBackend("m-stable") as a, TinyBackend("m-canary") as b:
        cfg = tmp_path / "router.yaml"
        cfg.write_text(json.dumps({"public_model": "pub", "backends": [
            {"name": "stable", "url": a.url, "weight": 100, "model_hash": h},
            {"name": "canary", "url": b.url, "weight": 0}]}))
        with RouterProcess("--config", cfg, log_path=tmp_path / "r.log", token="model-ref-token") as router:
            state = router.admin().state()
            assert state.backend("stable").model_hash == h and state.backend("canary").model_hash is None
