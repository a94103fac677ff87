#!/usr/bin/env bash
# The CUDA products' host harness (see host.cpp): g++ and python3, no GPU.
# LIBM_TIE_WINDOWS: device_ops::libm_rounding's windows, expf's and logf's
# (the test that runs this passes them; by hand: LIBM_TIE_WINDOWS="0.015625 0.5").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
python3 "$here/extract.py" "$here/../../platforms/cuda/src/ops.cu" "$out/extracted.inc" "$out/rope.inc" "$out/ggml.inc" "$out/attention.inc"
g++ -std=c++17 -O1 -w -ffp-contract=off -I"$out" "$here/ggml_steps.cpp" -o "$out/ggml_steps"
LIBM_ROUNDING_DIR="$here/../../device-ops/data/libm_rounding" "$out/ggml_steps"
g++ -std=c++17 -O1 -w -I"$out" "$here/host.cpp" -o "$out/host"
"$out/host"
