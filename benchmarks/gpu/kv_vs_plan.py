"""`qlift plan`'s KV cache estimate against the KV cache vLLM reports, for every server a run started.

Reads each run directory under $QLIFT_HOME/runs (qlift serve and qlift tune write them): its
config.yaml (the engine arguments vLLM got) and vllm.log ("KV cache size: N tokens", "Available
KV cache memory: X GiB"); plans the same arguments with qlift's planner on this machine's
hardware; writes one row per server.

    python3 benchmarks/gpu/kv_vs_plan.py MODEL --base chat-h200 -o $OUT/kv-vs-plan.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

_NOT_ENGINE = {"model", "host", "port", "served-model-name"}


def rows(model: Path, base: str, runs: Path) -> list[dict[str, Any]]:
    from qlift.hardware import detect
    from qlift.models.modeldir import ModelDir
    from qlift.serve.plan import plan_memory
    from qlift.serve.recipes import EngineSpec, load_recipe

    md, hw, recipe = ModelDir.open(model), detect(), load_recipe(base)
    out = []
    for run in sorted(p for p in runs.iterdir() if (p / "config.yaml").is_file() and (p / "vllm.log").is_file()):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        engine = {k.replace("-", "_"): v for k, v in cfg.items() if k not in _NOT_ENGINE}
        log = (run / "vllm.log").read_text(errors="replace")
        tokens = re.search(r"KV cache size: ([\d,]+) tokens", log)
        gib = re.search(r"Available KV cache memory: ([\d.]+) GiB", log)
        plan = plan_memory(md, recipe.model_copy(update={"engine": EngineSpec.model_validate(engine)}), hw)
        row: dict[str, Any] = {"run": run.name, "engine": engine, "plan_kv_tokens": plan.kv_capacity_tokens,
                               "plan_kv_gib": round(plan.kv_cache_bytes / 2**30, 2),
                               "vllm_kv_tokens": int(tokens.group(1).replace(",", "")) if tokens else None,
                               "vllm_kv_gib": float(gib.group(1)) if gib else None}
        if row["vllm_kv_tokens"]:
            row["plan_over_vllm"] = round(plan.kv_capacity_tokens / row["vllm_kv_tokens"], 3)
        out.append(row)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--base", default="chat-h200", help="The recipe whose hardware entry the plans use.")
    ap.add_argument("--runs", type=Path, default=Path(os.environ.get("QLIFT_HOME", Path.home() / ".cache/qlift"))
                    / "runs")
    ap.add_argument("-o", "--output", type=Path)
    a = ap.parse_args()
    result = rows(a.model, a.base, a.runs)
    for r in result:
        print(f"{r['run']}: plan {r['plan_kv_tokens']:,} tokens ({r['plan_kv_gib']} GiB), vLLM "
              f"{r['vllm_kv_tokens'] or 0:,} tokens ({r['vllm_kv_gib']} GiB): {r.get('plan_over_vllm')}x")
    if a.output:
        a.output.write_text(json.dumps(result, indent=2))
