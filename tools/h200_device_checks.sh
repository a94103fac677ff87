#!/bin/bash
# The device op layer's checks on the GPU machine in one command, after
# tools/h200_peer_bench.sh built llama.cpp with CUDA in the same machine
# session (issues 25 and 28): the op-by-op conformance of every CUDA op
# against the CPU reference (gpu_ops), qwen4_exp's generated goldens beside
# llama.cpp's own CUDA build (tools/h200_goldens_cuda.sh), dflash's device
# path against its host path (tools/h200_device_vs_host.sh), and the
# glm_moe_dsa, glm5_next and muse_glimmer device paths on their generated
# goldens (and muse_glimmer's projector against mm_encode's embeddings).
#
# Usage (repository root, on the GPU machine):
#   BIN=.devbin bash tools/h200_device_checks.sh
# BIN holds, plain or .gz, built here with --release: gpu_ops (`cargo test
# -p platform-cuda --features gpu-tests --test gpu_ops --no-run`),
# gpu_goldens (qwen4_exp's), gpu_goldens_dsa (glm_moe_dsa's), gpu_goldens_glm5
# (glm5_next's), gpu_goldens_muse (muse_glimmer's), xtask, qwen4_exp and
# dflash. $OUT gets checks.txt and
# what the two scripts write.
set -u
B=${BIN:?set BIN to the folder of the binaries}
B=$(readlink -f "$B"); O=${OUT:-/tmp/o}; mkdir -p "$O"
source "$(dirname "$0")/h200_lib.sh"
D=/tmp/checks/bin
for f in "$B"/*; do unpack_bin "$B" "$(basename "$f" .gz)" "$D" > /dev/null; done
NVRTC=$(nvrtc_ld_path)
NV=$NVRTC:${LD_LIBRARY_PATH:-}
{
  echo "== gpu_ops"
  LD_LIBRARY_PATH=$NV timeout 120 "$D/gpu_ops" --nocapture > "$O/gpu_ops.txt" 2>&1
  echo "gpu_ops rc=$?; the cases not ok and the failure:"
  grep -v ' ok$' "$O/gpu_ops.txt" | tail -n 40
  echo "== dflash, device against host"
  BIN=$D timeout 120 bash tools/h200_device_vs_host.sh 2>&1 | tail -n 12
  for g in gpu_goldens_dsa gpu_goldens_glm5 gpu_goldens_muse; do
    echo "== $g"
    LD_LIBRARY_PATH=$NV SEAM_GOLDEN_DEVICE=cuda timeout 120 "$D/$g" --nocapture 2>&1 |
      grep -E '^\{|test result|panicked|error' | tail -n 60
  done
  echo "== qwen4_exp goldens beside llama.cpp's CUDA build"
  BIN=$D timeout 240 bash tools/h200_goldens_cuda.sh 2>&1 | tail -n 40
} > "$O/checks.txt" 2>&1
cat "$O/checks.txt"
