"""pipeline_gpu.sh's summary: per load, the pipeline against `vllm serve` defaults, from rows.jsonl.

Reads the rows frontend_vs_defaults.py wrote as it measured (so a run cut at its limit still has a
summary) and prints one JSON object: per concurrency level and server, client and server-counter
output tok/s, both ratios to the defaults at that level, p99 inter-token (chunk) gap, p50 TTFT, and
whether the >= 2.0x target holds by both; and the host (GPU, CPU model and cores) the rows were measured on.
``python3 benchmarks/gpu/pipeline_summary.py OUT [--target 2.0]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def summarize(rows: list[dict[str, Any]], target: float) -> dict[str, Any]:
    measured = [r for r in rows if r.get("status") == "measured"]
    loads: dict[str, Any] = {}
    for c in sorted({r["concurrency"] for r in measured}, reverse=True):
        base = next((r for r in measured if r["server"] == "vllm-defaults" and r["concurrency"] == c), None)
        out = []
        for r in (r for r in measured if r["concurrency"] == c):
            item = {k: r.get(k) for k in ("server", "sets", "client_output_tokens_per_s", "server_output_tokens_per_s",
                                          "p99_chunk_gap_ms", "p50_ttft_ms", "p50_tpot_ms", "completed", "failed",
                                          "ready_s")}
            if base and r is not base:
                client, server = "client_output_tokens_per_s", "server_output_tokens_per_s"
                item["ratio_client"] = round(r[client] / base[client], 3)
                if r.get(server) and base.get(server):
                    item["ratio_server"] = round(r[server] / base[server], 3)
                item["target_met"] = min(item["ratio_client"], item.get("ratio_server", 0)) >= target
            out.append(item)
        loads[f"concurrency {c}"] = out
    missing = [r for r in rows if r.get("status") != "measured"]
    hosts = sorted({r["host"] for r in measured if r.get("host")})  # one per call: the same machine for every row
    host = hosts[0] if len(hosts) == 1 else hosts or None
    return {"target": target, "host": host, "loads": loads, "not_measured": missing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--target", type=float, default=2.0)
    a = ap.parse_args()
    path = a.out / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    print(json.dumps(summarize(rows, a.target), indent=2))


if __name__ == "__main__":
    main()
