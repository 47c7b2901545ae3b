"""gates_gpu.sh's summary table: one row per candidate and gated metric, from the eval reports.

``python3 benchmarks/gpu/gates_summary.py OUT/gates`` prints JSON: rows of (candidate, engine_args,
metric, value, baseline, diff and its 95% CI, gate, threshold, pass), each candidate's overall pass,
and the candidates that were skipped or failed to run (with the last line of their log).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def rows_of(name: str, report: dict[str, Any]) -> list[dict[str, Any]]:
    overall = {s["metric"]: s for s in report.get("overall", [])}
    out = []
    for g in report.get("gates", []):
        metric = g["expr"].split()[0].split("[")[0]
        s = overall.get(metric, {})
        out.append({"candidate": name, "engine_args": report["candidate"].get("engine_args") or {},
                    "metric": metric, "value": g["value"], "baseline": g["baseline"], "diff": s.get("diff"),
                    "ci95": [s.get("ci_low"), s.get("ci_high")], "gate": g["expr"], "threshold": g["threshold"],
                    "pass": g["passed"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gates", type=Path, help="The folder gates_gpu.sh writes ($OUT/gates).")
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    candidates: dict[str, Any] = {}
    for report in sorted(a.gates.glob("*/report.json"), key=lambda p: p.stat().st_mtime):
        data = json.loads(report.read_text())
        name = report.parent.name
        rows += rows_of(name, data)
        candidates[name] = {"passed": data["passed"], "content_hash": data["candidate"]["content_hash"],
                            "report": str(report), "examples": data["examples_count"], "seconds": data["seconds"]}
    for skipped in sorted(a.gates.glob("*.skipped.json")):
        candidates.setdefault(skipped.name.removesuffix(".skipped.json"), json.loads(skipped.read_text()))
    for log in sorted(a.gates.glob("*.log")):
        name = log.stem
        if name not in candidates:
            lines = log.read_text(errors="replace").strip().splitlines()
            candidates[name] = {"error": lines[-1] if lines else "no output (killed at its time limit?)"}
    print(json.dumps({"rows": rows, "candidates": candidates}, indent=2))


if __name__ == "__main__":
    main()
