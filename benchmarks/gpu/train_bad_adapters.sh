#!/usr/bin/env bash
# On the H200, from the project root, after payload.sh install (SmolLM2 bf16 in /tmp/smollm2): train the three
# deliberately bad LoRA fine-tunes of examples/train_bad_adapters.py (loops, chinese, refusal) on CUDA and hand
# them back as $OUT/bad-adapters.tar (they are committed under examples/bad-adapters/; a CPU takes minutes a step).
set -euo pipefail
# shellcheck source=/dev/null
source benchmarks/gpu/env.sh
mkdir -p "$OUT"
start=$(date +%s)
timeout 300 python3 examples/train_bad_adapters.py --base /tmp/smollm2 --device cuda --steps 80 -o /tmp/bad-adapters \
  2>&1 | grep -v -E "UserWarning|warnings.warn" | tail -12
tar -cf "$OUT/bad-adapters.tar" -C /tmp bad-adapters
echo "bad adapters trained in $(( $(date +%s) - start )) s"
