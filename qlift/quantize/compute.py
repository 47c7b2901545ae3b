"""How the calibration uses the CPU: thread count, OpenMP's wait policy, compute dtype.

An OpenMP thread that finds no work spins before it sleeps (GNU OpenMP's default, ACTIVE-ish).
With more threads than free cores, spinning threads steal the cores the working ones need: AWQ
of SmolLM2 beside two busy vLLM servers on the same 2 cores burned 1,700 s of CPU and took 55
minutes, against ~90 s alone. So the thread count follows the CPUs this process may actually use
(affinity and cgroup quota), and when others keep those cores busy the threads wait passively.

Without bf16 units (AVX512-BF16 or AMX) torch emulates bf16 maths; there calibration runs in
float32 and the checkpoint is still written in the model's dtype.

glibc serves an allocation between 128 KiB and 32 MiB with its own mmap and unmaps it on free:
AWQ's grid search allocates and frees activations thousands of times a layer, and each new
mapping's pages are zero-filled by the kernel on first touch. Kept in the heap instead
(``HEAP_MALLOC``), SmolLM2's AWQ (4 x 128 tokens, float32, one thread, a 2-core EPYC) took 53 s
against 73 s, its system time 1.4 s against 17 s, with the same tensors written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from qlift.hardware import CpuInfo, detect_cpu, usable_cpus

SHARED_BUSY_CORES = 0.5  # others' load on our CPUs (in cores) from which they count as shared
# glibc's largest mmap threshold (64-bit), and freed heap kept: the worker exits when the model is written
HEAP_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}


@dataclass
class ComputePlan:
    threads: int
    shared: bool  # other processes keep our CPUs busy
    dtype: str  # "auto" (the model's own) or "float32" / "bfloat16"
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def others_busy_cores(sample_s: float = 0.3) -> float:
    """How many of this process's CPUs others keep busy (sampled now, while qlift itself idles)."""
    import psutil

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    per_cpu = psutil.cpu_percent(interval=sample_s, percpu=True)
    mine = [per_cpu[i] for i in cpus if i < len(per_cpu)] if cpus else per_cpu
    return sum(mine) / 100.0


def compute_plan(*, threads: int | None = None, dtype: str = "auto", cpu: CpuInfo | None = None,
                 busy_cores: float | None = None, usable: int | None = None,
                 environ: dict[str, str] | None = None) -> ComputePlan:
    """The worker's threads, environment and dtype for a CPU calibration: by default one thread per
    usable CPU that others leave free (at least one)."""
    environ = dict(os.environ) if environ is None else environ
    cpu = cpu or detect_cpu()
    usable = usable or usable_cpus()
    busy = others_busy_cores() if busy_cores is None else busy_cores
    shared = busy >= SHARED_BUSY_CORES
    n = threads or (max(1, usable - round(busy)) if shared else usable)
    notes = []
    env = {"OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}
    env |= {k: v for k, v in HEAP_MALLOC.items() if k not in environ}  # a user's own setting stays
    if shared and "OMP_WAIT_POLICY" not in environ:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        notes.append(f"others keep {busy:.1f} of this process's {usable} CPU(s) busy: {n} calibration "
                     "thread(s) that sleep rather than spin while they wait")
    if threads and threads > usable:
        notes.append(f"--threads {threads} is more than the {usable} CPU(s) this process may use")
    chosen = dtype
    if dtype == "auto" and not cpu.native_bf16:
        chosen = "float32"
        notes.append(f"this CPU ({cpu.vector_isa}) has no bf16 units: calibrating in float32, "
                     "writing the checkpoint in the model's dtype")
    return ComputePlan(threads=n, shared=shared, dtype=chosen, env=env, notes=notes)
