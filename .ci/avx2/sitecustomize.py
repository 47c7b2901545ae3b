"""Emulated AVX2-only CPU for timing `.ci/run` on an AVX-512 machine (QLIFT_EMULATE_AVX2=1 puts this
directory on PYTHONPATH, so every Python process of the run, vLLM servers and `qlift` children
included, imports it at start-up, before torch).

What an AVX2-only host changes, made to happen here:
- torch's ATen kernels: ATEN_CPU_CAPABILITY=avx2, and oneDNN's ONEDNN_MAX_CPU_ISA=AVX2 (set here);
- vLLM's kernel library: vllm/platforms/cpu.py picks _C_AVX2 (no W4A16 kernel) when torch's
  ``torch.cpu._is_avx512_*`` checks say no, so those answer False here;
- qlift's own decisions (float32 where no bf16 units, W4A16 refused): ``qlift.hardware.detect_cpu``
  drops the AVX-512 and AMX flags from what it reads.
Not emulated: the core itself (clock, caches, microarchitecture); an AVX2-only EPYC is an older core.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

os.environ.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")

_DROPPED_PREFIXES = ("avx512", "amx")


def _patch_torch_cpu(module: Any) -> None:
    for name in dir(module):
        if name.startswith(("_is_avx512", "_is_amx")):
            setattr(module, name, lambda: False)


def _patch_qlift_hardware(module: Any) -> None:
    import dataclasses

    real = module.detect_cpu

    def detect_cpu(*args: Any, **kwargs: Any) -> Any:
        cpu = real(*args, **kwargs)
        if args or kwargs:  # a test's own cpuinfo file, not this machine
            return cpu
        flags = frozenset(f for f in cpu.flags if not f.startswith(_DROPPED_PREFIXES))
        return dataclasses.replace(cpu, avx512=False, avx512_bf16=False, amx=False, flags=flags)

    detect_cpu.__doc__ = real.__doc__
    module.detect_cpu = detect_cpu


_PATCHES = {"torch.cpu": _patch_torch_cpu, "qlift.hardware": _patch_qlift_hardware}


class _Patcher(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module  # type: ignore[union-attr]

        def exec_module(module: Any) -> None:
            real_exec(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign,union-attr]
        return spec


sys.meta_path.insert(0, _Patcher())
