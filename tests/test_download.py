"""qlift download / verify against a hub on 127.0.0.1 driven by the real huggingface_hub and
modelscope clients (tests/hubserver speaks both HTTP APIs)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hubserver import Fault, HubServer

from qlift.models.ref import dir_hash

REPO = "acme/tiny-chat"
BIG = "model.safetensors"


@pytest.fixture(autouse=True)
def _online(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """conftest turns the Hub off for the session (huggingface_hub reads HF_HUB_OFFLINE once, at
    import); these tests talk to a hub on 127.0.0.1 only."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for var in ("HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_TOKEN", "MODELSCOPE_ENDPOINT", "MODELSCOPE_DOMAIN",
                "MODELSCOPE_API_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms-cache"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def hub():  # type: ignore[no-untyped-def]
    with HubServer() as server:
        yield server


def tiny_files(seed: int = 0) -> dict[str, bytes]:
    """A small model repo as a fine-tune publishes it, plus a pickle twin and a README."""
    import numpy as np
    from safetensors.numpy import save

    rng = np.random.default_rng(seed)
    weights = save({"model.embed_tokens.weight": rng.standard_normal((1024, 1024)).astype(np.float32)})
    return {
        "config.json": json.dumps({"model_type": "qwen2", "seed": seed}).encode(),
        "generation_config.json": b'{"do_sample": false}',
        BIG: weights,
        "pytorch_model.bin": b"\x80\x04pickled" * 100,
        "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
        "tokenizer_config.json": b'{"eos_token": "<|im_end|>"}',
        "chat_template.jinja": b"{{ messages }}",
        "README.md": b"# tiny chat\n",
        "images/logo.png": b"\x89PNG",
    }


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_full_download_is_pinned_locked_and_inspectable(run_cli, hub, tiny_qwen2_tied: Path) -> None:
    files = {p.name: p.read_bytes() for p in tiny_qwen2_tied.iterdir() if p.is_file() and p.name != ".complete"}
    files["pytorch_model.bin"] = b"\x80\x04pickle"
    commit = hub.commit(REPO, files)

    r = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url, "--json")
    assert r.exit_code == 0, r.stderr
    out = Path("m")
    got = {p.name for p in out.iterdir()}
    assert got == (set(files) - {"pytorch_model.bin"}) | {"qlift.lock.json", "qlift.json"}
    assert "skipping 1 pickle weight file(s)" in r.stderr
    for name, data in files.items():
        if name != "pytorch_model.bin":
            assert (out / name).read_bytes() == data, name

    lock = json.loads((out / "qlift.lock.json").read_text())
    assert (lock["source"], lock["repo"], lock["commit"], lock["endpoint"]) == ("hf", REPO, commit, hub.url)
    assert {f["path"]: (f["size"], f["sha256"]) for f in lock["files"]} == {
        n: (len(d), sha(d)) for n, d in files.items() if n != "pytorch_model.bin"
    }
    assert json.loads(r.stdout)["commit"] == commit
    assert json.loads(r.stdout)["model_ref"]["content_hash"] == dir_hash(out)  # hashed once, as it was written
    manifest = json.loads((out / "qlift.json").read_text())
    assert manifest["operation"] == "download"
    assert manifest["parameters"]["commit"] == commit and manifest["parameters"]["source"] == "hf"
    assert not list(Path().glob(".m.qlift-download*"))  # staging removed

    inspected = run_cli("inspect", "m", "--json")
    assert inspected.exit_code == 0, inspected.stderr
    report = json.loads(inspected.stdout)
    assert report["architecture"] == "Qwen2ForCausalLM" and report["lineage"] == ["download"]

    v = run_cli("verify", "m")
    assert v.exit_code == 0 and "ok: 6 files" in v.stdout

    again = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url)
    assert again.exit_code == 3 and "--force" in again.stderr


def test_include_exclude_and_defaults(run_cli, hub) -> None:
    files = tiny_files()
    hub.commit(REPO, files)
    r = run_cli("download", REPO, "-o", "d", "--endpoint", hub.url)
    assert r.exit_code == 0, r.stderr
    taken = {p.name for p in Path("d").iterdir()} - {"qlift.lock.json", "qlift.json"}
    assert taken == set(files) - {"pytorch_model.bin", "images/logo.png"}

    r = run_cli("download", REPO, "-o", "j", "--endpoint", hub.url,
                "--include", "*.json", "--include", "*.bin", "--exclude", "generation_config.json")
    assert r.exit_code == 0, r.stderr
    lock = json.loads(Path("j/qlift.lock.json").read_text())
    assert [f["path"] for f in lock["files"]] == ["config.json", "pytorch_model.bin",
                                                  "tokenizer.json", "tokenizer_config.json"]
    assert not hub.file_gets("generation_config.json")[1:]  # fetched once, by the first download

    r = run_cli("download", REPO, "-o", "none", "--endpoint", hub.url, "--include", "*.gguf")
    assert r.exit_code == 2 and "no file of" in r.stderr and not Path("none").exists()


def test_revision_pinning(run_cli, hub) -> None:
    old, new = tiny_files(0), tiny_files(1)
    first = hub.commit(REPO, old)
    hub.tag(REPO, "v1", first)
    # The branch moves right after qlift resolved it: every file must still come from `first`.
    hub.after_listing.append(lambda: hub.commit(REPO, new))
    r = run_cli("download", REPO, "-o", "a", "--endpoint", hub.url, "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["commit"] == first
    assert Path("a/config.json").read_bytes() == old["config.json"]
    assert Path("a", BIG).read_bytes() == old[BIG]

    for rev in ("v1", first):
        r = run_cli("download", REPO, "-o", f"r-{rev[:8]}", "--endpoint", hub.url, "--revision", rev, "--json")
        assert r.exit_code == 0, r.stderr
        assert json.loads(r.stdout)["commit"] == first
        assert Path(f"r-{rev[:8]}", "config.json").read_bytes() == old["config.json"]

    r = run_cli("download", REPO, "-o", "latest", "--endpoint", hub.url)
    assert r.exit_code == 0 and Path("latest/config.json").read_bytes() == new["config.json"]

    r = run_cli("download", REPO, "-o", "x", "--endpoint", hub.url, "--revision", "nope")
    assert r.exit_code == 4 and "revision 'nope' not found" in r.stderr


@pytest.mark.parametrize("source", ["hf", "modelscope"])
def test_corrupted_once_is_fetched_again(run_cli, hub, source: str) -> None:
    files = tiny_files()
    hub.commit(REPO, files, branch="main" if source == "hf" else "master")
    hub.faults[BIG] = Fault(corrupt=1)
    hub.faults["config.json"] = Fault(corrupt=1)  # a small, non-LFS file: checked by git blob id / sha256
    r = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url, "--source", source)
    assert r.exit_code == 0, r.stderr
    for name in (BIG, "config.json"):
        assert len(hub.file_gets(name)) == 2
        assert f"{name}: " in r.stderr and "fetching it again" in r.stderr
        assert Path("m", name).read_bytes() == files[name]
    assert run_cli("verify", "m").exit_code == 0


def test_corrupted_every_time_fails_naming_the_file(run_cli, hub) -> None:
    files = tiny_files()
    hub.commit(REPO, files)
    hub.faults[BIG] = Fault(corrupt=None)
    hub.faults["config.json"] = Fault(delay_s=1.0)  # still in flight when BIG fails: finished, not lost
    r = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url)
    assert r.exit_code == 7
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: {BIG} from {REPO}@")
    assert "failed verification twice" in r.stderr and "Traceback" not in r.stderr
    assert len(hub.file_gets(BIG)) == 2
    assert not Path("m").exists()
    staging = Path(".m.qlift-download")
    assert not (staging / BIG).exists()  # nothing that failed is left looking complete
    journaled = set(json.loads((staging / "state.json").read_text())["files"])
    started = {name for name in files if hub.file_gets(name)} - {BIG}
    assert BIG not in journaled and journaled == started  # every file that had started was finished

    del hub.faults[BIG], hub.faults["config.json"]  # the hub is healthy again: the rerun fetches only what is missing
    gets_before = {name: len(hub.file_gets(name)) for name in files}
    r = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url)
    assert r.exit_code == 0, r.stderr
    refetched = {name for name in files if len(hub.file_gets(name)) > gets_before[name]}
    assert BIG in refetched and not refetched & journaled


def _qlift(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from qlift.cli import main; main()", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.parametrize("source", ["hf", "modelscope"])
def test_sigkill_mid_download_then_resume(run_cli, hub, tmp_path: Path, source: str) -> None:
    files = tiny_files()
    hub.commit(REPO, files, branch="main" if source == "hf" else "master")
    stall_at = 1024 * 1024
    hub.faults[BIG] = Fault(stall_after=stall_at)
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_HOME=str(tmp_path / "hf-home"), PYTHONUNBUFFERED="1")
    proc = _qlift("download", REPO, "-o", "m", "--endpoint", hub.url, "--source", source,
                  "--max-workers", "1", env=env)
    try:
        hub.wait_sent(BIG, stall_at)
        partial = Path(".m.qlift-download", BIG + ".incomplete")
        deadline = time.monotonic() + 20
        while source == "modelscope" and not (partial.exists() and partial.stat().st_size > 0):
            assert time.monotonic() < deadline, "modelscope wrote no partial file"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        hub.faults[BIG].release.set()
    assert proc.returncode == -signal.SIGKILL
    assert not Path("m").exists()
    done_before = sorted(p for p in files if p != BIG and hub.file_gets(p))
    assert "config.json" in done_before  # files sorted before BIG finished before the kill

    del hub.faults[BIG]
    r = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url, "--source", source)
    assert r.exit_code == 0, r.stderr
    assert f"resuming: {len(done_before)} file(s) already verified" in r.stderr
    for p in done_before:
        assert len(hub.file_gets(p)) == 1, p  # not downloaded again
    assert Path("m", BIG).read_bytes() == files[BIG]
    if source == "modelscope":  # its client continues the partial file with a Range request
        assert hub.file_gets(BIG)[-1].range is not None
    assert run_cli("verify", "m").exit_code == 0


def test_modelscope_source(run_cli, hub) -> None:
    files = tiny_files()
    head = hub.commit(REPO, files, branch="master")
    r = run_cli("download", REPO, "-o", "ms", "--source", "modelscope", "--endpoint", hub.url, "--json")
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)
    assert (result["source"], result["revision"], result["commit"]) == ("modelscope", "master", head)
    assert all(g.api == "ms-file" for g in hub.file_gets(BIG))
    assert Path("ms", BIG).read_bytes() == files[BIG]
    lock = json.loads(Path("ms/qlift.lock.json").read_text())
    assert lock["source"] == "modelscope" and lock["commit"] == head

    r = run_cli("download", "acme/missing", "-o", "x", "--source", "modelscope", "--endpoint", hub.url)
    assert r.exit_code == 4 and "acme/missing@master not found" in r.stderr


def test_auto_falls_back_to_modelscope_when_the_hub_is_down(run_cli, hub, monkeypatch) -> None:
    files = tiny_files()
    hub.commit(REPO, files, branch="master")
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
    with HubServer() as failing:
        failing.commit(REPO, files)
        failing.status_override = 503
        for out, endpoint in (("refused", closed_port_url()), ("503", failing.url)):
            r = run_cli("download", REPO, "-o", out, "--source", "auto", "--endpoint", endpoint, "--json")
            assert r.exit_code == 0, r.stderr
            assert f"cannot reach {endpoint}" in r.stderr and "trying ModelScope" in r.stderr
            assert json.loads(r.stdout)["source"] == "modelscope"
            assert Path(out, BIG).read_bytes() == files[BIG]

    # A repo the Hub does not have is not an outage: no fallback.
    with HubServer() as hf_hub:
        r = run_cli("download", REPO, "-o", "b", "--source", "auto", "--endpoint", hf_hub.url)
    assert r.exit_code == 4 and "not found" in r.stderr and "ModelScope" not in r.stderr


def test_verify_reports_changed_missing_and_extra(run_cli, hub) -> None:
    hub.commit(REPO, tiny_files())
    assert run_cli("download", REPO, "-o", "m", "--endpoint", hub.url).exit_code == 0
    m = Path("m")
    data = bytearray((m / BIG).read_bytes())
    data[100] ^= 1
    (m / BIG).write_bytes(bytes(data))  # same size, one bit
    (m / "tokenizer.json").unlink()
    (m / "notes.txt").write_text("x")
    r = run_cli("verify", "m", "--json")
    assert r.exit_code == 7
    result = json.loads(r.stdout)
    assert (result["changed"], result["missing"], result["extra"]) == ([BIG], ["tokenizer.json"], ["notes.txt"])
    assert "does not match its lockfile: 1 missing, 1 changed, 1 extra" in r.stderr

    r = run_cli("verify", ".")
    assert r.exit_code == 4 and "qlift.lock.json" in r.stderr


@pytest.mark.parametrize("source", ["hf", "modelscope"])
@pytest.mark.parametrize("name", ["../evil.json", "/etc/evil.json", "sub/../../evil.json"])
def test_path_traversal_is_refused(run_cli, hub, source: str, name: str) -> None:
    hub.commit(REPO, {"config.json": b"{}", name: b"{}"}, branch="main" if source == "hf" else "master")
    r = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url, "--source", source)
    assert r.exit_code == 5
    assert repr(name) in r.stderr and "leaves the download directory" in r.stderr
    assert not [q for q in hub.requests if q.api in ("hf-file", "ms-file")]
    assert sorted(os.listdir()) == ["ms-cache"] or not os.listdir()
    assert not Path("/etc/evil.json").exists() and not Path("../evil.json").exists()


def test_dry_run_and_disk_space(run_cli, hub) -> None:
    files = tiny_files()
    hub.commit(REPO, files)
    r = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url, "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["dry_run"] and plan["fits"] and plan["free_bytes"] > 0
    assert plan["total_bytes"] == sum(len(files[f["path"]]) for f in plan["files"])
    assert not Path("m").exists() and not hub.file_gets(BIG)
    human = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url, "--dry-run")
    assert "free at" in human.stdout and BIG in human.stdout and "fits" in human.stdout

    hub.published_size[BIG] = 1 << 60  # a repo larger than any disk
    r = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url, "--dry-run")
    assert r.exit_code == 0 and "DOES NOT FIT" in r.stdout
    r = run_cli("download", REPO, "-o", "m", "--endpoint", hub.url)
    assert r.exit_code == 6 and "free" in r.stderr
    assert not hub.file_gets(BIG) and not Path("m").exists()


def test_token_is_used_but_never_printed(run_cli, hub, monkeypatch) -> None:
    secret = "hf_qliftTESTtokenDoNotPrint0123456789"
    monkeypatch.setenv("MY_HUB_TOKEN", secret)
    hub.commit(REPO, tiny_files())
    r = run_cli("-v", "download", REPO, "-o", "m", "--endpoint", hub.url, "--token-env", "MY_HUB_TOKEN", "--json")
    assert r.exit_code == 0, r.stderr
    assert any(q.auth == f"Bearer {secret}" for q in hub.requests)  # it was sent to the hub
    bad = run_cli("--debug", "download", "acme/nope", "-o", "n", "--endpoint", hub.url, "--token-env", "MY_HUB_TOKEN")
    assert bad.exit_code == 4
    written = "".join(p.read_text(errors="replace") for p in Path("m").rglob("*") if p.is_file())
    for text in (r.stdout, r.stderr, bad.stdout, bad.stderr, written):
        assert secret not in text and secret[:12] not in text

    r = run_cli("download", REPO, "-o", "z", "--endpoint", hub.url, "--token-env", "UNSET_TOKEN_VAR")
    assert r.exit_code == 2 and "UNSET_TOKEN_VAR is not set" in r.stderr
