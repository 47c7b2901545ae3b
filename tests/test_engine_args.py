"""The vLLM argument-name snapshot and probe: no drift from the installed vLLM, a probe cached for
QLIFT_VLLM_PYTHON too, a corrupt cache re-probed instead of a crash, and no regeneration from itself.

The probe imports vLLM's arg parser in a subprocess (seconds); no engine starts.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import qlift.vllm.engine_args as ea
from qlift.errors import BadInputError
from qlift.vllm._arg_names import NAMES, VLLM_VERSION

SNAPSHOT = Path(ea.__file__).with_name("_arg_names.py")


def _wrapper(path: Path, *python_args: str) -> Path:
    """A real interpreter behind a script that logs each start (QLIFT_VLLM_PYTHON takes a path)."""
    log = path.with_suffix(".calls")
    path.write_text(f'#!/bin/sh\necho run >> "{log}"\nexec "{sys.executable}" {" ".join(python_args)} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _calls(wrapper: Path) -> int:
    log = wrapper.with_suffix(".calls")
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture(scope="module")
def installed() -> str:
    version = ea._installed_version(sys.executable)
    if version is None:
        pytest.skip("vLLM is not installed here")
    return version


@pytest.fixture(scope="module")
def probed(installed: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real probe through QLIFT_VLLM_PYTHON, starting from a corrupt cache file, then a second look."""
    tmp = tmp_path_factory.mktemp("vllm-args")
    python = _wrapper(tmp / "python")
    cache = tmp / "cache"
    mp = pytest.MonkeyPatch()
    mp.setenv("QLIFT_VLLM_PYTHON", str(python))
    mp.setenv("QLIFT_CACHE_DIR", str(cache))
    corrupt = ea.probe_cache(installed)
    corrupt.parent.mkdir(parents=True)
    corrupt.write_bytes(b'{"version": "0.0", "names": [1, 2')
    try:
        ea.vllm_arg_names.cache_clear()
        first = ea.vllm_arg_names()
        calls_first = _calls(python)
        ea.vllm_arg_names.cache_clear()
        second = ea.vllm_arg_names()
        calls_second = _calls(python) - calls_first
    finally:
        ea.vllm_arg_names.cache_clear()
        mp.undo()
    return {"first": first, "second": second, "calls": (calls_first, calls_second), "cache": corrupt}


def test_snapshot_matches_the_installed_vllm(installed, probed) -> None:
    version, names = probed["first"]
    assert version == installed
    assert installed == VLLM_VERSION, (
        f"vLLM {installed} is installed but the snapshot is of {VLLM_VERSION}: run `python -m qlift.vllm.engine_args`")
    assert names == NAMES, ("the snapshot drifted from vLLM; run `python -m qlift.vllm.engine_args`: "
                            f"new {sorted(names - NAMES)}, gone {sorted(NAMES - names)}")


def test_a_corrupt_cache_is_probed_again_and_rewritten(probed) -> None:
    assert probed["calls"][0] == 2  # the version (metadata only), then the probe
    assert ea._read_cache(probed["cache"]) == probed["first"]


def test_the_probe_for_qlift_vllm_python_is_cached(probed) -> None:
    assert probed["calls"][1] == 1  # only the version; the names come from the cache
    assert probed["second"] == probed["first"]


@pytest.mark.parametrize("content", [b"", b"\xff\xfe", b"[]", b'{"version": 1, "names": []}',
                                     b'{"version": "1", "names": "abc"}', b'{"names": []}', b"{" * 5000])
def test_an_unreadable_cache_file_is_ignored(tmp_path, content) -> None:
    f = tmp_path / "x.json"
    f.write_bytes(content)
    assert ea._read_cache(f) is None
    assert ea._read_cache(tmp_path / "missing.json") is None


def test_without_vllm_the_static_list_stands_in(tmp_path, monkeypatch) -> None:
    python = _wrapper(tmp_path / "python", "-S")  # no site-packages: no vLLM
    monkeypatch.setenv("QLIFT_VLLM_PYTHON", str(python))
    ea.vllm_arg_names.cache_clear()
    try:
        version, names = ea.vllm_arg_names()
    finally:
        ea.vllm_arg_names.cache_clear()
    assert names == NAMES and version.startswith(VLLM_VERSION) and "not installed" in version


def test_regenerating_without_vllm_leaves_the_snapshot_alone(tmp_path) -> None:
    before = SNAPSHOT.read_bytes()
    python = _wrapper(tmp_path / "python", "-S")
    env = {**os.environ, "QLIFT_VLLM_PYTHON": str(python)}
    r = subprocess.run([sys.executable, "-m", "qlift.vllm.engine_args"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "vLLM cannot be imported" in r.stderr, r.stderr
    assert SNAPSHOT.read_bytes() == before


def test_write_snapshot_round_trips(tmp_path) -> None:
    out = tmp_path / "names.py"
    ea.write_snapshot(VLLM_VERSION, NAMES, out)
    scope: dict[str, Any] = {}
    exec(compile(out.read_text(), str(out), "exec"), scope)
    assert scope["NAMES"] == NAMES and scope["VLLM_VERSION"] == VLLM_VERSION
    assert out.read_text() == SNAPSHOT.read_text()


def test_the_probe_and_snapshot_hold_the_server_front_end_arguments(probed) -> None:
    """`vllm serve`'s own arguments (no dataclass holds api_server_count) beside the engine's and FrontendArgs'."""
    _, names = probed["first"]
    for name in ("api_server_count", "headless", "stream_interval", "max_num_seqs", "uvicorn_log_level"):
        assert name in names and name in NAMES, name
    assert "config" not in names and "model_tag" not in names  # qlift writes --config; the model is qlift's


def test_front_end_arguments_pass_and_config_is_qlifts() -> None:
    assert ea.check_arg_name("api-server-count") == "api_server_count"
    assert ea.check_arg_name("stream_interval") == "stream_interval"
    with pytest.raises(BadInputError, match="'config' is set by qlift"):
        ea.check_arg_name("config")
