#!/bin/bash
# Kernel tuning on the GPU machine without a Rust toolchain: one family
# binary's decode tokens/s and prefill seconds under variants of the CUDA
# kernels, each a sed
# script over platforms/cuda/src/ops.cu (compiled through
# SEAM_CUDA_KERNELS_SOURCE) and/or extra NVRTC options (SEAM_NVRTC_EXTRA),
# on one generated model, with the built-in kernels first as the baseline.
#
# Usage (repository root, on the GPU machine):
#   BIN=.devbin [FAMILY=muse_glimmer] [LAYERS=4] [STEPS=33] \
#     bash tools/h200_kernel_variants.sh
# Variants are the `name|sed script|nvrtc options` lines of VARIANTS
# (default: the ones below; a sed script's delimiter is not `|`). $OUT gets variants.txt.
set -u
source "$(dirname "$0")/h200_lib.sh"
B=$(readlink -f "${BIN:?set BIN to the folder of the release binaries}")
O=${OUT:-/tmp/o}; mkdir -p "$O"; V=/tmp/kernel_variants; mkdir -p "$V/bin"
FAMILY=${FAMILY:-muse_glimmer}; LAYERS=${LAYERS:-4}; STEPS=${STEPS:-33}
# The prompt: PROMPT_N tokens (64: the prefill's products batched).
PROMPT=$(prompt_ids "${PROMPT_N:-64}")
DEFAULT_VARIANTS='built-in||
maxrregcount 64||--maxrregcount=64
8 activation rows a pass (MM_NB)||-DMM_NB=8
decode launch bounds 256x4|s/extern "C" __global__ void matvec_i8_##NAME(/extern "C" __global__ void __launch_bounds__(256, 4) matvec_i8_##NAME(/|'
VARIANTS=${VARIANTS:-$DEFAULT_VARIANTS}
NVRTC=$(nvrtc_ld_path)
export LD_LIBRARY_PATH=$NVRTC:${LD_LIBRARY_PATH:-}
X=$(unpack_bin "$B" "$FAMILY" "$V/bin") || { echo "no $FAMILY in $B"; exit 1; }
M=$V/$FAMILY-$LAYERS.gguf
[ -f "$M" ] || timeout 200 "$X" --write-generated "$M" --layers "$LAYERS" -q || exit 1
st=(--stage all); [ "$FAMILY" = muse_glimmer ] && st=()
{
  echo "$FAMILY, $LAYERS layers, $STEPS decode steps: variant | decode tok/s | prefill s | rc"
  i=0
  while IFS='|' read -r name script extra; do
    [ -n "$name" ] || continue
    i=$((i + 1))
    src=()
    if [ -n "$script" ]; then
      sed -e "$script" platforms/cuda/src/ops.cu > "$V/v$i.cu"
      cmp -s "$V/v$i.cu" platforms/cuda/src/ops.cu && { echo "$name | the script changed nothing"; continue; }
      src=(SEAM_CUDA_KERNELS_SOURCE="$V/v$i.cu")
    fi
    env "${src[@]}" SEAM_NVRTC_EXTRA="$extra" timeout 150 "$X" "$M" --device cuda "${st[@]}" --json -q \
      --tokens "$PROMPT" --steps "$STEPS" > "$V/v$i.json" 2> "$V/v$i.err"
    rc=$?
    python3 -c "
import json, sys
try:
    d = json.load(open(sys.argv[1]))['decode']
    print(f\"{sys.argv[2]} | {d['tokens_per_second']:.2f} | {d['prefill_seconds']:.3f} | {sys.argv[3]}\")
except Exception as e:
    print(f'{sys.argv[2]} | - | - | {sys.argv[3]} ({e})')
" "$V/v$i.json" "$name" "$rc"
    [ "$rc" = 0 ] || tail -n 3 "$V/v$i.err"
  done <<< "$VARIANTS"
} 2>&1 | tee "$O/variants.txt"
