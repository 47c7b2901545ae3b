"""Nothing the user had is lost: outputs never land on, in or around an input; two writers
of one output never both succeed; outputs share no inode with the cache; file names read
from indexes, lockfiles and manifests stay inside their directory (issue: hardening)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_download import REPO, HubServer, sha, tiny_files

from qlift.errors import OutputExistsError
from qlift.fsutil import atomic_output_dir, rename_noreplace


def _tree(path: Path) -> dict[str, tuple[int, float]]:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime)
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def base_and_lora(tmp_path: Path, tiny_qwen2_tied: Path, tiny_lora_tied: Path) -> tuple[Path, Path]:
    """Writable copies of the cached tiny model and adapter (the tests try to destroy them)."""
    base, lora = tmp_path / "base", tmp_path / "lora"
    shutil.copytree(tiny_qwen2_tied, base)
    shutil.copytree(tiny_lora_tied, lora)
    return base, lora


@pytest.mark.parametrize("target", ["base", "lora", "base/sub", "lora/deeper/x", ".", "link-to-base"])
def test_merge_never_writes_onto_into_or_around_an_input(run_cli, base_and_lora, tmp_path: Path,
                                                         target: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    base, lora = base_and_lora
    (tmp_path / "link-to-base").symlink_to(base)
    (base / "sub").mkdir()
    (lora / "deeper").mkdir()
    monkeypatch.chdir(tmp_path)
    before = {p: _tree(p) for p in (base, lora)}
    r = run_cli("merge", "base", "lora", "-o", target, "--force", "--no-verify")
    assert r.exit_code == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "the input" in line and "Choose an -o path outside every input" in line
    assert {p: _tree(p) for p in (base, lora)} == before
    assert not list(tmp_path.glob(".*.partial")) and not list(base.glob(".*.partial"))


def test_quantize_and_import_refuse_their_input_as_output(run_cli, tmp_path: Path, tiny_qwen2_tied: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_qwen2_tied, model)
    before = _tree(model)
    r = run_cli("quantize", model, "--fp8", "-o", model, "--force")
    assert r.exit_code == 2 and "is the input" in r.stderr, r.stderr
    r = run_cli("quantize", model, "--fp8", "-o", model / "q", "--force")
    assert r.exit_code == 2 and "lies inside the input" in r.stderr, r.stderr
    assert _tree(model) == before

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    r = run_cli("import-gguf", gguf, "-o", gguf, "--force")
    assert r.exit_code == 2 and "is the input" in r.stderr, r.stderr
    assert gguf.read_bytes() == b"GGUF"


def test_the_later_of_two_writers_fails_instead_of_replacing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(OutputExistsError), atomic_output_dir(out) as tmp:
        (tmp / "mine.txt").write_text("mine")
        out.mkdir()  # another run finished first (an empty dir would be replaced by a plain rename)
        (out / "theirs.txt").write_text("theirs")
    assert sorted(os.listdir(out)) == ["theirs.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # our temp dir is gone

    empty = tmp_path / "empty"
    with pytest.raises(OutputExistsError), atomic_output_dir(empty) as tmp:
        (tmp / "mine.txt").write_text("mine")
        empty.mkdir()
    assert not list(empty.iterdir())

    src = tmp_path / "a.txt"
    src.write_text("a")
    with pytest.raises(FileExistsError):
        rename_noreplace(src, out)
    rename_noreplace(src, tmp_path / "b.txt")
    assert (tmp_path / "b.txt").read_text() == "a"


@pytest.mark.slow
def test_two_concurrent_merges_to_one_output_one_wins(base_and_lora, tmp_path: Path) -> None:
    base, lora = base_and_lora
    out = tmp_path / "merged"
    argv = [sys.executable, "-m", "qlift", "merge", str(base), str(lora), "-o", str(out), "--no-verify"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 3], results
    loser = next(err for code, err in results if code == 3)
    assert "already exists" in loser and "Traceback" not in loser
    manifest = json.loads((out / "qlift.json").read_text())
    assert manifest["operation"] == "merge"
    assert not list(tmp_path.glob(".merged.*"))


def test_builtin_import_outputs_share_no_inode_with_the_cache(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli("import-gguf", "--builtin", "smollm2", "-o", a).exit_code == 0
    for f in a.iterdir():
        assert f.stat().st_ino != (smollm2_dir / f.name).stat().st_ino, f.name
    cfg = json.loads((a / "config.json").read_text())
    cfg["note"] = "edited in place"
    with open(a / "config.json", "r+", encoding="utf-8") as fh:  # in place: same inode
        fh.write(json.dumps(cfg))
    assert "note" not in json.loads((smollm2_dir / "config.json").read_text())
    assert run_cli("import-gguf", "--builtin", "smollm2", "-o", b).exit_code == 0
    assert "note" not in json.loads((b / "config.json").read_text())


def test_repo_files_named_like_qlifts_are_kept_apart(run_cli, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.chdir(tmp_path)
    theirs = {"qlift.json": b'{"operation": "merge", "by": "upstream"}', "qlift.lock.json": b'{"upstream": 1}'}
    with HubServer() as hub:
        hub.commit(REPO, {**tiny_files(), **theirs})
        r = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url, "--json")
    assert r.exit_code == 0, r.stderr
    m = tmp_path / "m"
    for name, data in theirs.items():
        assert (m / "qlift-upstream" / name).read_bytes() == data
    assert json.loads((m / "qlift.json").read_text())["operation"] == "download"
    lock = json.loads((m / "qlift.lock.json").read_text())
    kept = {f["path"]: f for f in lock["files"] if "repo_path" in f}
    assert kept["qlift-upstream/qlift.json"] == {"path": "qlift-upstream/qlift.json", "repo_path": "qlift.json",
                                                 "size": len(theirs["qlift.json"]), "sha256": sha(theirs["qlift.json"])}
    r = run_cli("verify", "m", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["ok"], r.stdout + r.stderr


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/hostname", "sub/../../outside.safetensors",
                                  "link/model.safetensors"])
def test_index_entries_outside_the_model_are_refused(run_cli, tmp_path: Path, tiny_qwen2_tied: Path,
                                                     tiny_lora_tied: Path, name: str) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_qwen2_tied, model)
    shutil.copy(model / "model.safetensors", tmp_path / "outside.safetensors")
    (model / "link").symlink_to(tmp_path)
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": name}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    for argv in (["inspect", model], ["merge", model, tiny_lora_tied, "-o", tmp_path / "o"]):
        r = run_cli(*argv)
        assert r.exit_code == 5, (argv, r.stderr)
        assert "lies outside" in r.stderr and "\n" not in r.stderr.strip()


@pytest.mark.parametrize("name", ["../x", "/etc/hostname", "a/../../x"])
def test_lockfile_and_manifest_entries_outside_are_refused(run_cli, tmp_path: Path, tiny_qwen2_tied: Path,
                                                           name: str) -> None:
    d = tmp_path / "dl"
    d.mkdir()
    (tmp_path / "x").write_bytes(b"x")
    lock = {"source": "hf", "endpoint": "e", "repo": "o/r", "revision": "main", "commit": "c" * 40,
            "files": [{"path": name, "size": 1, "sha256": sha(b"x")}]}
    (d / "qlift.lock.json").write_text(json.dumps(lock))
    r = run_cli("verify", d)
    assert r.exit_code == 5 and "lies outside" in r.stderr, r.stderr

    model = tmp_path / "model"
    shutil.copytree(tiny_qwen2_tied, model)
    manifest = {"operation": "import-gguf", "outputs": {name: {"size": 1, "sha256": sha(b"x"), "mtime_ns": 0}}}
    (model / "qlift.json").write_text(json.dumps(manifest))
    r = run_cli("inspect", model, "--json")
    # inspect only reads lineage; what must not happen is a file outside being trusted as recorded
    assert r.exit_code in (0, 5), r.stderr
    from qlift.errors import UnsafeInputError
    from qlift.lineage import recorded_hashes

    with pytest.raises(UnsafeInputError):
        recorded_hashes(model)
