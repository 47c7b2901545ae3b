#!/usr/bin/env bash
# On the H200 machine, from the project root: join the parts of the offline vLLM 0.26 bundle
# (built here by ../shared/gpu/prepare-vllm.sh, re-split by split-bundle.sh), check them against
# .gpu-vllm/SHA256 and install vLLM and its packages into /tmp/site.
# Each part travels in its own device call (a call carries at most 64 MiB with the tree):
#   mkdir -p /tmp/gpu-vllm && cp .gpu-vllm/partNN /tmp/gpu-vllm/      (carry .gpu-vllm/partNN)
# then this script in the call that brings the last part.
set -euo pipefail
src=${1:-.gpu-vllm}
root=$PWD
mkdir -p /tmp/gpu-vllm
cp "$src"/part* /tmp/gpu-vllm/ 2>/dev/null || true
cd /tmp/gpu-vllm
cat part* > bundle.tar
[ "$(sha256sum bundle.tar | cut -d' ' -f1)" = "$(cat "$root/$src/SHA256")" ] || { echo "parts do not match SHA256: $(ls)"; exit 1; }
tar -xf bundle.tar && mkdir -p /tmp/site wh && tar -xJf vllm.tar.xz -C /tmp/site && tar -xf core.tar -C wh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl
rm -f bundle.tar vllm.tar.xz core.tar part*
PYTHONPATH=/tmp/site python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
