#!/usr/bin/env bash
# Where the decode step's time goes at 256 streams (issue 41), one device call, from the project root after the
# vLLM install: `qlift serve FP8 --recipe auto` (+ SETS, default kv_cache_dtype=fp8) with vLLM's torch profiler
# on, loaded by `qlift bench` at 256 at a time, profiled for a few seconds by benchmarks/gpu/step_profile.py
# (step time, GPU busy/idle, time by kernel category, against the HBM floor). The server is started in its own
# process group and stopped by it. Results in $OUT: step-profile.json, step-profile-bench.*, server-profile.log.
#   source benchmarks/gpu/env.sh && FP8_MODEL=/tmp/qwen7b-fp8 bash benchmarks/gpu/profile_gpu.sh
set -uo pipefail
source benchmarks/gpu/env.sh
fp8=${FP8_MODEL:-/tmp/qwen7b-fp8}
sets=${SETS-kv_cache_dtype=fp8}
limit=${LIMIT:-420}
prof=/tmp/qlift-prof
rm -rf "$prof" && mkdir -p "$prof"
PROF="{\"profiler\": \"torch\", \"torch_profiler_dir\": \"$prof\", \"torch_profiler_with_stack\": false,
 \"torch_profiler_dump_cuda_time_total\": false, \"ignore_frontend\": true, \"detailed_trace_annotation\": true}"
# HBM bandwidth of the card this runs on (the floor's denominator), from its name
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H200*) hbm=4800 ;;
  *H100*HBM3*|*H100\ 80GB*) hbm=3350 ;;
  *) hbm=${HBM_GBPS:-3350} ;;
esac
argv=(python3 -m qlift serve "$fp8" --recipe auto --served-model-name m --port 8000 --set "profiler_config=$PROF")
for s in $sets; do argv+=(--set "$s"); done
if python3 - "$fp8" <<'PY'; then argv+=(--set load_format=dummy); fi
import sys
sys.path.insert(0, "benchmarks/gpu")
from frontend_vs_defaults import headers_only
from pathlib import Path
sys.exit(0 if headers_only(Path(sys.argv[1])) else 1)
PY
echo "profile: ${argv[*]} (HBM ${hbm} GB/s)" | tee "$OUT/profile-run.log"
setsid "${argv[@]}" > "$OUT/server-profile.log" 2>&1 &
srv=$!
trap 'kill -INT -- -$srv 2>/dev/null; sleep 20; kill -KILL -- -$srv 2>/dev/null' EXIT
timeout -s TERM $((limit - 40)) python3 benchmarks/gpu/step_profile.py http://127.0.0.1:8000 --trace-dir "$prof" \
    --model "$fp8" --load-concurrency 256 --window-s 3 --hbm-gbps "$hbm" --out "$OUT" 2>&1 | tee -a "$OUT/profile-run.log"
ls -la "$prof" >> "$OUT/profile-run.log" 2>&1
