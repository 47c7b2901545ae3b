#!/usr/bin/env bash
# Issue 32, the quantize step, in one device call on the H200, from the project root:
#   source benchmarks/gpu/env.sh && bash benchmarks/gpu/quantize_gpu.sh
# Needs: the llm-compressor wheelhouse extracted at /tmp/llmc-wh (or .gpu-llmc/llmc-wheelhouse.tar and its
# SHA256 in the tree: then it is checked and extracted there); SmolLM2's bf16 model at /tmp/smollm2 for
# steps 2, 3 and 7 (left out when it is not there).
#   1 env-setup       qlift env quantize --setup --wheelhouse /tmp/llmc-wh (offline)
#   2 smollm2-fp8     qlift quantize /tmp/smollm2 --fp8 --device cuda -> /tmp/smollm2-fp8
#   3 smollm2-awq     qlift quantize /tmp/smollm2 --awq --device cuda -> /tmp/smollm2-awq
#   4 build-big       a Qwen2.5-7B-shaped model with random bf16 weights on disk (~15 GB) -> /tmp/qwen7b-bf16
#   5 bench-big       benchmarks/quantize.py on it: qlift --fp8 vs model_free_ptq vs llm-compressor's example
#                     (BIG_REPEAT rounds; first, so qlift sees the model as a first run would)
#   6 big-fp8         qlift quantize --fp8 of it -> /tmp/qwen7b-fp8 (what pipeline_gpu.sh serves; BIG_FP8=0: not)
#   7 bench-smollm2   the same on SmolLM2, AWQ too (qlift vs the example flow), if time is left
# Into $OUT: NAME.json (each step's stdout: qlift --json, the benchmark's runs), logs/NAME.log, steps.jsonl
# (rc, seconds, limit of every step, skipped ones too). Every step runs under `timeout` (which stops the
# step's whole process group, llm-compressor's worker included) and the whole stays within DEADLINE_S.
# A CPU rehearsal: QUANTIZE_DEVICE=cpu SHAPE=tiny WH=... SMOL=... (see docs/gpu.md).
set -uo pipefail
DEV=${QUANTIZE_DEVICE:-cuda}
WH=${WH:-/tmp/llmc-wh}
SMOL=${SMOL:-/tmp/smollm2}
SHAPE=${SHAPE:-7b}
BIG=${BIG:-/tmp/qwen${SHAPE}-bf16}
DEADLINE_S=${DEADLINE_S:-470}
PY=${PYTHON:-python3}
AWQ_ARGS=${AWQ_ARGS:-}          # e.g. "--num-samples 8 --seq-len 64" for a CPU rehearsal
BENCH_REPEAT=${BENCH_REPEAT:-2}
BIG_REPEAT=${BIG_REPEAT:-1}     # FP8 runs of each kind on the 7B shape (qlift, model_free_ptq, the example)
LIMIT_SCALE=${LIMIT_SCALE:-1}  # a CPU rehearsal's steps take longer: every step's limit and reserve times this
OUT=${OUT:-/tmp/qlift-gpu-out}
mkdir -p "$OUT/logs"
: > "$OUT/steps.jsonl"
start=$SECONDS

# step NAME LIMIT_S RESERVE_S COMMAND...: run COMMAND under timeout, stdout to $OUT/NAME.json, stderr to
# logs/NAME.log; skipped when fewer than RESERVE_S seconds of the deadline are left.
step() {
  local name=$1 limit=$(($2 * LIMIT_SCALE)) reserve=$(($3 * LIMIT_SCALE))
  shift 3
  local left=$((DEADLINE_S - (SECONDS - start)))
  if ((left < reserve)); then
    echo "{\"step\": \"$name\", \"skipped\": true, \"seconds_left\": $left}" >> "$OUT/steps.jsonl"
    echo "== $name: skipped (${left} s left, needs ${reserve})"
    return 1
  fi
  ((limit > left)) && limit=$left
  echo "== $name (limit ${limit} s): $*"
  local t0=$SECONDS rc
  timeout -k 10 "$limit" "$@" > "$OUT/$name.json" 2> "$OUT/logs/$name.log"
  rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0)), \"limit_s\": $limit}" >> "$OUT/steps.jsonl"
  echo "   rc $rc in $((SECONDS - t0)) s; $(tail -n 1 "$OUT/logs/$name.log" | cut -c1-300)"
  return $rc
}

if [ ! -d "$WH" ] && [ -f .gpu-llmc/llmc-wheelhouse.tar ]; then
  [ "$(sha256sum .gpu-llmc/llmc-wheelhouse.tar | cut -d' ' -f1)" = "$(cat .gpu-llmc/SHA256)" ] \
    || { echo "llmc-wheelhouse.tar does not match .gpu-llmc/SHA256"; exit 1; }
  mkdir -p "$WH" && tar -xf .gpu-llmc/llmc-wheelhouse.tar -C "$WH"
fi
ls "$WH" > "$OUT/logs/wheelhouse.txt" 2>&1
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
  > "$OUT/logs/versions.txt" 2>&1
[ "$DEV" = cuda ] && nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >> "$OUT/logs/versions.txt" 2>&1

step env-setup 240 60 $PY -m qlift --json env quantize --setup --wheelhouse "$WH" || { echo "no tool env: stop"; exit 1; }
if [ -d "$SMOL" ]; then
  step smollm2-fp8 90 30 $PY -m qlift --json quantize "$SMOL" --fp8 --device "$DEV" -o "${SMOL}-fp8" --force
  # shellcheck disable=SC2086  # AWQ_ARGS is a list of options
  step smollm2-awq 150 60 $PY -m qlift --json quantize "$SMOL" --awq --device "$DEV" -o "${SMOL}-awq" --force $AWQ_ARGS
fi
if [ -f "$BIG/model.safetensors.index.json" ] || step build-big 150 90 $PY benchmarks/gpu/build_model.py "$BIG" --shape "$SHAPE" --random; then
  du -sb "$BIG" > "$OUT/logs/big-size.txt" 2>&1
  # First the benchmark, so each of its qlift runs hashes the model as a first sight would (nothing memoised)
  step bench-big $((120 * BIG_REPEAT)) 120 $PY benchmarks/quantize.py --device "$DEV" --model "$BIG" --skip-awq \
    --repeat "$BIG_REPEAT" --example --json-out "$OUT/bench-big-runs.json"
  # then the checkpoint the pipeline call serves (benchmarks/gpu/pipeline_gpu.sh): qlift's own FP8 of the 7B shape
  [ "${BIG_FP8:-1}" = 1 ] && step big-fp8 150 90 $PY -m qlift --json quantize "$BIG" --fp8 --device "$DEV" -o "${BIG%-bf16}-fp8" --force
fi
if [ -d "$SMOL" ]; then
  # shellcheck disable=SC2086
  step bench-smollm2 150 90 $PY benchmarks/quantize.py --device "$DEV" --model "$SMOL" --repeat "$BENCH_REPEAT" --example \
    --json-out "$OUT/bench-smollm2-runs.json" $AWQ_ARGS
fi
echo "== done in $((SECONDS - start)) s"
cat "$OUT/steps.jsonl"
