"""qlift merge against peft merge_and_unload + save_pretrained and `cp -r`, in one run.

Builds a model with random bf16 weights in a real checkpoint layout (Qwen2.5-1.5B shape:
hidden 1536, 28 layers, vocab 151936, tied, ~2.9 GB in 4 shards; or --shape 7b) and a
real peft LoRA adapter (r=16, alpha=32, all 7 linear projections, non-zero B), then
times each tool in its own process and reads its peak RSS from the kernel (wait4).

Targets: qlift wall <= 2x cp; qlift >= 3.5x faster than peft; qlift peak RSS <= 1.5x the
largest shard.

    .venv/bin/python benchmarks/merge_vs_peft.py                 # 1.5B shape, CPU
    .venv/bin/python benchmarks/merge_vs_peft.py --base-manifest # base from `qlift download`
    python benchmarks/merge_vs_peft.py --shape 7b --device cuda  # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPES = {
    "1.5b": dict(hidden=1536, layers=28, heads=12, kv=2, inter=8960, vocab=151936, tied=True, shards=4),
    "7b": dict(hidden=3584, layers=28, heads=28, kv=4, inter=18944, vocab=152064, tied=False, shards=4),
}
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

PEFT_SCRIPT = """
import sys, torch
from transformers import AutoModelForCausalLM
from peft import PeftModel
base, adapter, out, device = sys.argv[1:5]
m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16, device_map=device)
m = PeftModel.from_pretrained(m, adapter).merge_and_unload()
m.save_pretrained(out)
"""


def _shapes(s: dict) -> dict[str, tuple[int, ...]]:
    h, kvd = s["hidden"], s["hidden"] // s["heads"] * s["kv"]
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s["vocab"], h)}
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
            p + "self_attn.k_proj.weight": (kvd, h), p + "self_attn.k_proj.bias": (kvd,),
            p + "self_attn.v_proj.weight": (kvd, h), p + "self_attn.v_proj.bias": (kvd,),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (s["inter"], h), p + "mlp.up_proj.weight": (s["inter"], h),
            p + "mlp.down_proj.weight": (h, s["inter"]),
        }
    out["model.norm.weight"] = (h,)
    if not s["tied"]:
        out["lm_head.weight"] = (s["vocab"], h)
    return out


def build(work: Path, shape: str) -> tuple[Path, Path]:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config

    s = SHAPES[shape]
    base, adapter = work / f"base-{shape}", work / f"lora-{shape}"
    if (base / ".complete").exists() and (adapter / ".complete").exists():
        return base, adapter
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(adapter, ignore_errors=True)
    base.mkdir(parents=True)
    adapter.mkdir(parents=True)
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # 15 GB of randn for 7b is minutes on a CPU
    shapes = _shapes(s)
    total = sum(2 * torch.Size(v).numel() for v in shapes.values())
    per, shards, cur, size = total / s["shards"], [], {}, 0
    for name, shp in shapes.items():
        cur[name] = (torch.randn(shp, device=dev) * 0.02).to(torch.bfloat16).cpu()
        size += cur[name].numel() * 2
        if size >= per and len(shards) < s["shards"] - 1:
            shards.append(cur)
            cur, size = {}, 0
    shards.append(cur)
    weight_map = {}
    for i, sh in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, base / fname, metadata={"format": "pt"})
        weight_map |= {n: fname for n in sh}
    (base / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    Qwen2Config(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["inter"],
                num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
                tie_word_embeddings=s["tied"], dtype="bfloat16", max_position_embeddings=32768,
                architectures=["Qwen2ForCausalLM"]).save_pretrained(base)
    lora = {}
    for name, shp in shapes.items():
        mod = name.removesuffix(".weight")
        if name.endswith(".weight") and mod.rsplit(".", 1)[-1] in PROJ:
            key = "base_model.model." + mod
            lora[key + ".lora_A.weight"] = torch.randn(16, shp[1]) / shp[1] ** 0.5
            lora[key + ".lora_B.weight"] = torch.randn(shp[0], 16) * 0.01
    save_file(lora, adapter / "adapter_model.safetensors", metadata={"format": "pt"})
    (adapter / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
        "target_modules": list(PROJ), "bias": "none", "base_model_name_or_path": str(base),
        "inference_mode": True, "fan_in_fan_out": False,
    }))
    (base / ".complete").touch()
    (adapter / ".complete").touch()
    return base, adapter


def timed(argv: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RSS bytes and CPU seconds (user + sys) of one child process.

    Dirty pages left by the previous run are flushed first: otherwise the next writer is
    throttled by their writeback and pays for its predecessor's output.
    """
    os.sync()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{argv[:3]} failed:\n{err[-2000:]}")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def _base_manifest(base: Path, want: bool) -> None:
    """With ``want``, give the base the qlift.json a `qlift download` leaves (every file's
    sha256), so qlift reuses those digests instead of hashing the base; else hide it."""
    manifest, hidden = base / "qlift.json", base / "qlift.json.off"
    if not want:
        if manifest.exists():
            manifest.rename(hidden)
        return
    if hidden.exists():
        hidden.rename(manifest)
    if not manifest.exists():
        sys.path.insert(0, str(REPO))
        from qlift.lineage import utc_now, write_manifest

        write_manifest(base, operation="download", inputs={}, parameters={"bench": "merge_vs_peft"},
                       started_at=utc_now())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.5b")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both qlift and peft use it)")
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "bench-merge")
    ap.add_argument("--skip-peft", action="store_true")
    ap.add_argument("--base-manifest", action="store_true",
                    help="give the base a qlift.json with its files' sha256, as `qlift download` does "
                         "(qlift then need not hash the base); default: a bare base, the worst case")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool; the best wall time counts")
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.build_only:
        build(a.work, a.shape)
        return
    # Build in a child: children inherit the parent's peak RSS at fork, which would mask theirs.
    subprocess.run([sys.executable, __file__, "--build-only", "--shape", a.shape, "--work", str(a.work)], check=True)
    base, adapter = a.work / f"base-{a.shape}", a.work / f"lora-{a.shape}"
    _base_manifest(base, a.base_manifest)
    shards = sorted(base.glob("*.safetensors"))
    largest = max(p.stat().st_size for p in shards)
    size = sum(p.stat().st_size for p in shards)
    out = a.work / "out"
    qlift = [sys.executable, "-c", "from qlift.cli import main; main()", "merge", str(base), str(adapter),
             "-o", str(out), "--no-verify", "--force", "--device", a.device]
    tools = [
        ("cp -r", ["cp", "-r", str(base), str(out)]),
        ("qlift merge", qlift),
        ("peft merge_and_unload", [sys.executable, "-c", PEFT_SCRIPT, str(base), str(adapter), str(out), a.device]),
    ]
    if a.skip_peft:
        tools = tools[:2]
    runs: dict[str, tuple[float, int, float]] = {}
    load = os.getloadavg()[0]  # other work on the machine skews every wall time
    for _ in range(a.repeat):  # best of N per tool, the tools interleaved so load hits them alike
        for name, argv in tools:
            shutil.rmtree(out, ignore_errors=True)
            r = timed(argv)
            runs[name] = min(runs.get(name, r), r)
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    print(f"shape {a.shape}, device {a.device}: {len(shards)} shards, {size / 1e9:.2f} GB, "
          f"largest shard {largest / 1e9:.2f} GB, base {'with' if a.base_manifest else 'without'} a manifest, "
          f"{len(os.sched_getaffinity(0))} cores, load {load:.1f} at start")
    for name, (wall, rss, cpu) in runs.items():
        print(f"  {name:<24} {wall:7.1f} s   peak RSS {rss / 1e9:6.2f} GB   cpu {cpu:6.1f} s")
    q_wall, q_rss, _ = runs["qlift merge"]
    checks = [(f"qlift / cp wall          {q_wall / runs['cp -r'][0]:5.2f}x (target <= 2.0)",
               q_wall <= 2 * runs["cp -r"][0]),
              (f"qlift RSS / largest shard {q_rss / largest:5.2f}x (target <= 1.5)", q_rss <= 1.5 * largest)]
    if "peft merge_and_unload" in runs:
        p_wall = runs["peft merge_and_unload"][0]
        checks.insert(1, (f"peft / qlift wall        {p_wall / q_wall:5.2f}x (target >= 3.5)", p_wall >= 3.5 * q_wall))
    for text, ok in checks:
        print(f"  {text}  {'ok' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
