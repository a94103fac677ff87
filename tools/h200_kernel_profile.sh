#!/bin/bash
# Where a family's decode and prefill spend the GPU's time: each family's
# `--write-generated` model (LAYERS_<family> layers), a decode of
# DECODE_STEPS steps and a PREFILL_N-token prefill with
# SEAM_CUDA_KERNEL_TIMES=1 (platform-cuda's per-kernel device times, printed
# when the op layer goes), the report's decode keys beside them.
#
# Usage (repository root, on the GPU machine):
#   BIN=.devbin bash tools/h200_kernel_profile.sh [FAMILY...]
# BIN holds the family binaries (plain or .gz). $OUT gets profile.txt.
set -u
B=${BIN:?set BIN to the folder of the release binaries}
B=$(readlink -f "$B"); O=${OUT:-/tmp/o}; mkdir -p "$O"
F=/tmp/kernel_profile; mkdir -p "$F/bin"
DSTEPS=${DECODE_STEPS:-17}; PN=${PREFILL_N:-512}
source "$(dirname "$0")/h200_lib.sh"
NVRTC=$(nvrtc_ld_path)
export LD_LIBRARY_PATH=$NVRTC:${LD_LIBRARY_PATH:-}
bin() { unpack_bin "$B" "$1" "$F/bin"; }
P=$(prompt_ids "$PN")
FAMS=("$@"); [ ${#FAMS[@]} -gt 0 ] || FAMS=(muse_glimmer glm_moe_dsa glm5_next qwen4_exp)
for fam in "${FAMS[@]}"; do
  X=$(bin "$fam") || { echo "no $fam in $B"; continue; }
  case $fam in glm_moe_dsa) d=5 ;; glm5_next) d=4 ;; qwen4_exp) d=4 ;; *) d=4 ;; esac
  v=LAYERS_$fam; n=${!v:-$d}
  M=$F/$fam.gguf
  [ -f "$M" ] || timeout 200 "$X" --write-generated "$M" --layers "$n" -q
  st=(--stage all); [ "$fam" = muse_glimmer ] && st=()
  for run in "decode 1,2,3 $DSTEPS" "prefill $P 1"; do
    set -- $run
    echo "== $fam $1 ($n layers)"
    SEAM_CUDA_KERNEL_TIMES=1 timeout 150 "$X" "$M" --device cuda "${st[@]}" --json -q --tokens "$2" --steps "$3" \
      > "$F/$fam-$1.json" 2> "$F/$fam-$1.err"
    echo "rc=$?"
    python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))['decode']
print({k: d[k] for k in ('prefill_seconds','seconds','tokens_per_second','prefill_tokens_per_second')}, 'launches', d['kernel_launches'][:3], 'transfers', d['host_transfers'][:3])
" "$F/$fam-$1.json" 2>&1 | tail -1
    grep -A 40 'kernel times' "$F/$fam-$1.err" | head -n 41
    grep -v 'kernel times\|^  ' "$F/$fam-$1.err" | grep -v ': policy: ' | tail -n 3
  done
  rm -f "$M"
done 2>&1 | tee "$O/profile.txt"
