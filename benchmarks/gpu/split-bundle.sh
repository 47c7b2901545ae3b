#!/usr/bin/env bash
# Here, from the project root, after ../shared/gpu/prepare-vllm.sh .gpu-vllm: re-split the bundle into
# parts that travel with this checkout (~20 MiB) inside one device call's 64 MiB.
set -euo pipefail
dir=${1:-.gpu-vllm}
size=${2:-40M}
cat "$dir"/part* > "$dir/bundle.tar"
[ "$(sha256sum "$dir/bundle.tar" | cut -d' ' -f1)" = "$(cat "$dir/SHA256")" ] || { echo "parts do not match SHA256"; exit 1; }
rm -f "$dir"/part*
split -b "$size" -d "$dir/bundle.tar" "$dir/part"
rm "$dir/bundle.tar"
ls -l "$dir"
