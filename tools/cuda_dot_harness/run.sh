#!/usr/bin/env bash
# The CUDA products' host harness (see host.cpp): g++ and python3, no GPU.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
python3 "$here/extract.py" "$here/../../platforms/cuda/src/ops.cu" "$out/extracted.inc" "$out/rope.inc" "$out/ggml.inc" "$out/attention.inc"
g++ -std=c++17 -O1 -w -ffp-contract=off -I"$out" "$here/ggml_steps.cpp" -o "$out/ggml_steps"
"$out/ggml_steps"
g++ -std=c++17 -O1 -w -I"$out" "$here/host.cpp" -o "$out/host"
"$out/host"
