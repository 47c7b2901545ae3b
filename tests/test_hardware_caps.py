"""The CPU capability probe: which vLLM kernels this CPU gets, and refusing what they cannot run.

The AVX2 host is faked with another machine's /proc/cpuinfo; the real path (vLLM's own kernel
libraries loaded into torch) runs on whatever CPU the tests run on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from qlift import cpu_support
from qlift.cpu_support import cpu_can_run, kernel_library, library_has_op, requirement, vllm_cpu_build
from qlift.hardware import CpuInfo, cgroup_cpu_quota, detect_cpu

BASE_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
              "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid "
              "extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
              "aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse "
              "3dnowprefetch osvw topoext ssbd ibrs ibpb stibp vmmcall fsgsbase bmi1 avx2 smep bmi2 erms "
              "invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves clzero xsaveerptr")
AVX512_FLAGS = "avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512vbmi avx512_vbmi2 avx512_vnni"
MILAN = ("AMD EPYC 7B13", BASE_FLAGS)  # Zen 3: AVX2, no AVX-512
GENOA_NO_BF16 = ("AMD EPYC test AVX-512", f"{BASE_FLAGS} {AVX512_FLAGS}")
TURIN = ("AMD EPYC 9B45", f"{BASE_FLAGS} {AVX512_FLAGS} avx512_bf16 avx512_vp2intersect")  # Zen 5
SAPPHIRE_RAPIDS = ("Intel(R) Xeon(R) Processor", f"{BASE_FLAGS} {AVX512_FLAGS} avx512_bf16 avx512_fp16 amx_bf16 "
                   "amx_tile amx_int8")

AWQ_CONFIG = {"quant_method": "compressed-tensors", "format": "pack-quantized",
              "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                            "weights": {"num_bits": 4, "type": "int", "symmetric": False,
                                                        "strategy": "group", "group_size": 64}}}}


def fake_cpu(tmp_path: Path, model: str, flags: str) -> CpuInfo:
    text = "".join(f"processor\t: {i}\nvendor_id\t: AuthenticAMD\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
                   for i in range(2))
    (tmp_path / "cpuinfo").write_text(text)
    return detect_cpu(tmp_path / "cpuinfo")


def installed_vllm() -> Path:
    build = vllm_cpu_build()
    if build is None:
        pytest.skip("vllm-cpu is not installed")
    return build[1]


def test_cpuinfo_flags_decide_vllms_kernel_library(tmp_path: Path) -> None:
    milan, genoa, turin = (fake_cpu(tmp_path, *c) for c in (MILAN, GENOA_NO_BF16, TURIN))
    assert (milan.avx512, milan.native_bf16, milan.vector_isa) == (False, False, "AVX2 without AVX-512")
    assert (turin.avx512, turin.native_bf16, turin.vector_isa) == (True, True, "AVX-512 with BF16")
    assert [kernel_library(c) for c in (milan, genoa, turin)] == ["_C_AVX2", "_C_AVX512", "_C"]
    assert milan.model == "AMD EPYC 7B13" and "avx2" in milan.flags
    spr = fake_cpu(tmp_path, *SAPPHIRE_RAPIDS)
    assert (spr.amx, spr.vector_isa, kernel_library(spr)) == (True, "AVX-512 with BF16 and AMX", "_C")


def test_eval_caches_each_kernel_paths_answers_apart(tmp_path: Path, smollm2_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu's bf16 greedy answers differ between an AMX Xeon and an AVX-512 EPYC (docs/eval.md, "The cache"):
    answers cached on one CPU kind are never read as another's."""
    from qlift import hardware
    from qlift.eval.generation import EvalModel, Request, Sampling, cache_key
    from qlift.eval.vllm_backend import VllmBackend

    installed_vllm()
    model = EvalModel(role="candidate", name="smollm2")
    model.path = smollm2_dir
    seen = {}
    for name, flags in (MILAN, TURIN, SAPPHIRE_RAPIDS):
        cpu = fake_cpu(tmp_path, name, flags)
        monkeypatch.setattr(hardware, "detect_cpu", lambda cpu=cpu: cpu)
        seen[name] = VllmBackend().numerics(model)
    version = metadata.version("vllm-cpu")
    assert list(seen.values()) == [f"vllm-cpu {version}, _C_AVX2, float32", f"vllm-cpu {version}, _C, bfloat16",
                                   f"vllm-cpu {version}, _C AMX, bfloat16"]
    req = Request(messages=[{"role": "user", "content": "Name a color."}], prompt=None, reference=None)
    keys = {cache_key("h", "vllm", req, Sampling(), n) for n in seen.values()}
    assert len(keys) == 3 and cache_key("h", "vllm", req, Sampling(), "") not in keys


def test_quantization_configs_map_to_the_op_they_need() -> None:
    assert requirement(None) is None
    assert requirement({"quant_method": "bitsandbytes"}) is None
    assert requirement(AWQ_CONFIG) == cpu_support.Requirement("W4A16 (pack-quantized)", "cpu_gemm_wna16")
    assert requirement({"quant_method": "awq", "bits": 4}).op == "cpu_gemm_wna16"  # type: ignore[union-attr]
    assert requirement({"quant_method": "gptq", "bits": 8}).label == "W8A16 (GPTQ)"  # type: ignore[union-attr]
    fp8 = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8},
                                                                         "input_activations": {"dynamic": True}}}}
    assert requirement(fp8).op == "fp8_scaled_mm_with_quant"  # type: ignore[union-attr]


def test_awq_is_refused_on_avx2_and_allowed_on_avx512(tmp_path: Path) -> None:
    pkg = installed_vllm()
    milan, turin = fake_cpu(tmp_path, *MILAN), fake_cpu(tmp_path, *TURIN)
    no = cpu_can_run(AWQ_CONFIG, milan, pkg)
    assert not no.ok and no.library == "_C_AVX2"
    assert "cpu_gemm_wna16" in no.reason and "AVX2 without AVX-512" in no.reason and "AMD EPYC 7B13" in no.reason
    assert cpu_can_run(AWQ_CONFIG, turin, pkg).ok
    assert cpu_can_run(AWQ_CONFIG, fake_cpu(tmp_path, *GENOA_NO_BF16), pkg).ok
    assert cpu_can_run(None, milan, pkg).ok  # bf16 works everywhere


LOADS_AND_ASKS = """
import sys, torch
torch.ops.load_library(sys.argv[1])
print(hasattr(torch.ops._C, sys.argv[2]))
"""


@pytest.mark.parametrize("library", ["this CPU's", "_C_AVX2"])
def test_the_file_scan_agrees_with_the_ops_torch_registers(library: str) -> None:
    """The real path: load vLLM's kernel library into torch and ask for the op, as vLLM does at a forward."""
    pkg = installed_vllm()
    name = kernel_library(detect_cpu()) if library == "this CPU's" else library
    so = sorted(pkg.glob(f"{name}.*so"))[0]
    for op in ("cpu_gemm_wna16", "rms_norm"):
        out = subprocess.run([sys.executable, "-c", LOADS_AND_ASKS, str(so), op], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == str(library_has_op(so, op)), (name, op)
    assert library_has_op(so, "rms_norm")
    if name == "_C_AVX2":
        assert not library_has_op(so, "cpu_gemm_wna16")


@pytest.fixture
def awq_shaped(tiny_qwen2_tied: Path, tmp_path: Path) -> Path:
    """The tiny model's weights under a config that says W4A16: enough for the checks before vLLM starts."""
    out = tmp_path / "tiny-awq"
    shutil.copytree(tiny_qwen2_tied, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"quantization_config": AWQ_CONFIG}))
    (out / "qlift.json").write_text(json.dumps({"operation": "quantize", "inputs": [
        {"role": "model", "path": "/models/tiny-bf16", "content_hash": "x"}], "outputs": {}}))
    return out


@pytest.fixture
def on_milan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed_vllm()
    milan = fake_cpu(tmp_path, *MILAN)
    monkeypatch.setattr(cpu_support, "detect_cpu", lambda: milan)


@pytest.mark.parametrize("command", [
    ["serve", "{model}", "--recipe", "cpu", "--port", "0", "--timeout", "5"],
    ["eval", "{model}", "--backend", "vllm", "--prompts", "examples/prompts/smoke.jsonl", "--no-cache"],
    ["batch", "{model}", "{input}", "-o", "{out}"],
])
def test_serve_eval_batch_refuse_awq_on_an_avx2_cpu(command: list[str], awq_shaped: Path, on_milan: None,
                                                   tmp_path: Path) -> None:
    from click.testing import CliRunner

    from qlift.cli.main import cli

    (tmp_path / "in.jsonl").write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    args = [a.format(model=awq_shaped, input=tmp_path / "in.jsonl", out=tmp_path / "out.jsonl") for a in command]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 6, (r.output, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "cpu_gemm_wna16" in lines[0] and "AVX2 without AVX-512" in lines[0]
    assert "/models/tiny-bf16" in lines[0] and "GPU" in lines[0]
    assert ("--backend transformers" in lines[0]) == (command[0] == "eval")
    assert not (tmp_path / "out.jsonl").exists()


def test_the_bf16_model_passes_the_check_on_an_avx2_cpu(tiny_qwen2_tied: Path, on_milan: None) -> None:
    cpu_support.require_cpu_support(tiny_qwen2_tied)


def test_usable_cpus_honours_a_cgroup_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert cgroup_cpu_quota(tmp_path) == 0.5


def test_the_demo_serves_bf16_where_the_cpu_cannot_serve_int4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """`make demo` on an AVX2-only host: one line saying the rollout serves bf16; nothing to say on AVX-512."""
    import importlib.util

    installed_vllm()
    spec = importlib.util.spec_from_file_location("demo", Path(__file__).parents[1] / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "demo", demo)  # its dataclasses look their module up there
    spec.loader.exec_module(demo)
    note = demo.int4_serving_note(fake_cpu(tmp_path, *MILAN))
    assert note is not None and "\n" not in note and "serves bf16 stable and canary" in note
    assert "AWQ checkpoint is still made and evaluated" in note
    assert demo.int4_serving_note(fake_cpu(tmp_path, *TURIN)) is None


EMULATED_AVX2 = """
import json, torch
from qlift.cpu_support import kernel_library
from qlift.hardware import detect_cpu
from vllm.platforms.cpu import CpuPlatform

cpu = detect_cpu()
CpuPlatform.import_kernels()
print(json.dumps({"aten": torch.backends.cpu.get_cpu_capability(), "avx512": torch.cpu._is_avx512_supported(),
                  "bf16": torch.cpu._is_avx512_bf16_supported(), "isa": cpu.vector_isa, "native_bf16": cpu.native_bf16,
                  "library": kernel_library(cpu), "wna16": hasattr(torch.ops._C, "cpu_gemm_wna16")}))
"""


def test_the_emulated_avx2_host_is_avx2_to_torch_vllm_and_qlift() -> None:
    """`QLIFT_EMULATE_AVX2=1 bash .ci/run` times the suite as an AVX2-only host: every layer that picks
    kernels by the CPU's flags must see AVX2 only, or the run measures the wrong machine."""
    installed_vllm()
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo / ".ci" / "avx2")}
    proc = subprocess.run([sys.executable, "-c", EMULATED_AVX2], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"aten": "AVX2", "avx512": False, "bf16": False, "isa": "AVX2 without AVX-512",
                    "native_bf16": False, "library": "_C_AVX2", "wna16": False}
