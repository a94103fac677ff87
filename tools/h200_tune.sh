#!/bin/bash
# Usage (repository root, on the GPU machine; binaries built here and carried):
#   BIN=.devbin LAYERS=20 bash tools/h200_tune.sh ["--maxrregcount=80" ...]
# The GPU op check, then qwen4_exp's decode (--stage all, 3 x 33 steps) on a
# generated model of the public checkpoint's sizes, once with the kernels
# as they are and once per set of extra NVRTC options given
# (SEAM_NVRTC_EXTRA), each checked against the plain run's greedy tokens;
# then the per-kernel device times of the plain kernels. To $OUT/summary.txt.
set -u
B=${BIN:?set BIN to the folder of the binaries}; O=${OUT:-/tmp/o}; mkdir -p "$O"
LAYERS=${LAYERS:-20}; S=$O/summary.txt
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$S"; }
source "$(dirname "$0")/h200_lib.sh"
NVRTC=$(nvrtc_ld_path)
export LD_LIBRARY_PATH=$NVRTC:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
if [ -x "$B/gpu_ops" ]; then
  timeout 240 "$B/gpu_ops" --nocapture > "$O/gpu_ops.log" 2>&1; say "gpu_ops rc=$?"
  grep -E 'FAIL|OpCounters' "$O/gpu_ops.log" | head -8 | tee -a "$S"
fi
F=/tmp/gen$LAYERS.gguf
[ -s "$F" ] || timeout 300 "$B/qwen4_exp" --write-generated "$F" --layers "$LAYERS" > /dev/null 2>&1
say "model $(stat -c %s "$F") bytes"
decode() { # TAG: three runs, tok/s and tokens
  for i in 1 2 3; do
    timeout 150 "$B/qwen4_exp" "$F" --device cuda --stage all --tokens 1,2,3 --steps 33 --json > "$O/d.json" 2> "$O/d.err"
    python3 -c "import json;r=json.load(open('$O/d.json'));d=r['decode'];print('$1', 'run $i', round(d['tokens_per_second'],1), 'tok/s, launches/step', d['kernel_launches'][-1], 'tokens', r['generated'][:8])" 2>&1 | tee -a "$S"
  done
}
decode plain
for opt in "$@"; do SEAM_NVRTC_EXTRA="$opt" decode "$opt"; done
SEAM_CUDA_KERNEL_TIMES=1 timeout 150 "$B/qwen4_exp" "$F" --device cuda --stage all --tokens 1,2,3 --steps 5 > /dev/null 2> "$O/times.err"
grep -A16 'kernel times' "$O/times.err" | tee -a "$S"
say done
