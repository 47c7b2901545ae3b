"""qlift.vllm.worker without vLLM: a one-shot worker, and a serial one that takes job after job (tune's bench
client: one vLLM import for every grid point)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qlift.errors import ExternalToolError
from qlift.vllm.worker import Worker, run_worker

MODULE = '''
import os, sys
from pathlib import Path
from qlift.vllm.worker import serve_jobs

def run(job):
    if job.get("fail"):
        raise ValueError("asked to fail")
    return {"twice": 2 * job["n"], "pid": os.getpid()}

sys.exit(serve_jobs(Path(sys.argv[1]), run))
'''


@pytest.fixture
def module_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "echo_worker.py").write_text(MODULE, encoding="utf-8")
    here = str(Path(__file__).resolve().parents[1])
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), here, os.environ.get("PYTHONPATH", "")])}


def test_a_serial_worker_answers_job_after_job_in_one_process(module_env: dict[str, str]) -> None:
    with Worker("echo_worker", name="echo", env=module_env, serial=True) as worker:
        results = []
        for n in (1, 2, 3):
            worker.submit({"n": n})
            results.append(worker.wait(timeout_s=60))
        assert [r["twice"] for r in results] == [2, 4, 6]
        assert {r["pid"] for r in results} == {worker.proc.pid} and worker.proc.poll() is None  # still waiting
        worker.submit({"n": 0, "fail": True})  # a job that fails: its error, and the worker goes on
        with pytest.raises(ExternalToolError, match="echo failed: ValueError: asked to fail"):
            worker.wait(timeout_s=60)
        worker.submit({"n": 5})
        assert worker.wait(timeout_s=60)["twice"] == 10
    assert worker.proc.poll() is not None


def test_a_one_shot_worker_exits_after_its_job(module_env: dict[str, str]) -> None:
    assert run_worker("echo_worker", {"n": 4}, name="echo", env=module_env, timeout_s=60)["twice"] == 8
