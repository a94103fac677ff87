#!/bin/bash
# Issue 28's benchmark (and issue 25's decode and prefill lines): decode and
# 512-token prefill tokens/s of qwen4_exp, glm_moe_dsa, glm5_next and
# muse_glimmer on the GPU, each on the model its binary's
# `--write-generated` writes (the public checkpoint's sizes, LAYERS_<family>
# layers), beside llama.cpp's llama-bench (`-ngl 999`) on the same file in the
# same machine session. One family at a time: write its model, run both, drop
# the file (the machine's disk holds one).
#
# Usage (repository root, on the GPU machine, after tools/h200_peer_bench.sh
# or tools/h200_checks_only.sh built llama.cpp with CUDA into
# $PEER_STATE/build in the same machine session):
#   BIN=.devbin bash tools/h200_family_bench.sh [FAMILY...]
# BIN holds the release binaries qwen4_exp, glm_moe_dsa, glm5_next and
# muse_glimmer (plain or .gz). Knobs: LAYERS_qwen4_exp (default 10),
# LAYERS_glm_moe_dsa (6: 3 dense + 3 MoE),
# LAYERS_glm5_next (4: one 3 KDA : 1 MLA period), LAYERS_muse_glimmer (16),
# DEV=cuda, STAGE=all, REPS=2, DECODE_STEPS=33, PREFILL_N=512, LB_N=32,
# BUDGET=540 (seconds for the whole script; a family whose turn comes with
# less than 90 s left is skipped). $OUT gets family_bench.txt (the table),
# family_bench.jsonl (every run) and family_bench.log.
set -u
B=${BIN:?set BIN to the folder of the release binaries}
B=$(readlink -f "$B"); O=${OUT:-/tmp/o}; mkdir -p "$O"
S=${PEER_STATE:-/tmp/peer}; F=/tmp/family_bench; mkdir -p "$F/bin"
LB=$S/build/bin/llama-bench
DEV=${DEV:-cuda}; STAGE=${STAGE:-all}; REPS=${REPS:-2}; DSTEPS=${DECODE_STEPS:-33}
PN=${PREFILL_N:-512}; LBN=${LB_N:-32}; BUDGET=${BUDGET:-540}
T0=$(date +%s)
# The runs accumulate in $F across calls on one machine; a family done
# before is skipped.
LOG=$O/family_bench.log; J=$F/family_bench.jsonl; touch "$J"
PY=$(dirname "$0")/peer/peer_summary.py
say() { echo "[+$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
left() { echo $((BUDGET - $(date +%s) + T0)); }
# SKIP_LLAMA=1: ours only (llama.cpp's figures from an earlier run on the
# same files, which --write-generated writes byte for byte again).
if [ "${SKIP_LLAMA:-0}" != 1 ]; then
  [ -x "$LB" ] || { say "no $LB: build llama.cpp first (tools/h200_peer_bench.sh a)"; exit 1; }
fi
source "$(dirname "$0")/h200_lib.sh"
NVRTC=$(nvrtc_ld_path)
NVLP=$NVRTC:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
bin() { unpack_bin "$B" "$1" "$F/bin"; }
run() { # FAMILY NAME TIMEOUT CMD...
  local fam=$1 n=$2 to=$3 t0 t1 rc
  shift 3
  [ "$to" -gt "$(left)" ] && to=$(left)
  [ "$to" -lt 20 ] && { say "$fam $n: skipped, $(left) s left"; return 1; }
  t0=$(date +%s.%N)
  timeout -k 5 "$to" "$@" > "$F/$fam-$n.out" 2> "$F/$fam-$n.err"
  rc=$?
  t1=$(date +%s.%N)
  # one JSON line per run, as tools/h200_peer_bench.sh records its runs
  python3 "$PY" rec "$J" "$fam/$n" "$rc" "$t0" "$t1" "$F/$fam-$n.out"
  say "$fam $n rc=$rc $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
  [ "$rc" = 0 ] || tail -n 3 "$F/$fam-$n.err" | tee -a "$LOG"
  return "$rc"
}
done_before() { grep -q "\"name\": \"$1/ours_prefill_$REPS\", \"rc\": 0," "$J"; }
P512=$(prompt_ids "$PN")
FAMS=("$@"); [ ${#FAMS[@]} -gt 0 ] || FAMS=(qwen4_exp muse_glimmer glm_moe_dsa glm5_next)
for fam in "${FAMS[@]}"; do
  done_before "$fam" && { say "$fam: done before"; continue; }
  [ "$(left)" -lt 90 ] && { say "$fam: skipped, $(left) s left"; continue; }
  X=$(bin "$fam") || { say "no $fam in $B"; continue; }
  case $fam in qwen4_exp) d=10 ;; glm_moe_dsa) d=6 ;; glm5_next) d=4 ;; *) d=16 ;; esac
  v=LAYERS_$fam; n=${!v:-$d}
  M=$F/$fam.gguf
  st=(--stage "$STAGE"); [ "$fam" = muse_glimmer ] && st=() # dense: no experts to stage
  rm -f "$F"/*.gguf
  run "$fam" write 240 "$X" --write-generated "$M" --layers "$n" || continue
  python3 "$PY" rec "$J" "$fam/info" 0 0 0 /dev/null "layers=$n" "bytes=$(stat -c %s "$M")"
  say "$fam: $n layers, $(stat -c %s "$M") bytes, disk free $(df -Pk "$F" | awk 'NR==2{printf "%.1f GiB", $4/1048576}')"
  [ "${SKIP_LLAMA:-0}" = 1 ] || run "$fam" lb_decode 120 "$LB" -m "$M" -ngl 999 -p 0 -n "$LBN" -r "$REPS" -o json
  [ "${SKIP_LLAMA:-0}" = 1 ] || run "$fam" lb_prefill 120 "$LB" -m "$M" -ngl 999 -p "$PN" -n 0 -r "$REPS" -o json
  for i in $(seq "$REPS"); do
    run "$fam" "ours_decode_$i" 150 env LD_LIBRARY_PATH="$NVLP" "$X" "$M" --device "$DEV" "${st[@]}" --json -q --tokens 1,2,3 --steps "$DSTEPS"
    run "$fam" "ours_prefill_$i" 150 env LD_LIBRARY_PATH="$NVLP" "$X" "$M" --device "$DEV" "${st[@]}" --json -q --tokens "$P512" --steps 1
  done
  rm -f "$M"
done
cp "$J" "$O/family_bench.jsonl"
python3 - "$J" <<'PY' | tee "$O/family_bench.txt"
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
for r in runs:  # names are FAMILY/RUN
    r["family"], r["run"] = r["name"].split("/", 1)
def best(fam, prefix, pick):
    xs = []
    for r in runs:
        if r["family"] == fam and r["run"].startswith(prefix) and r["rc"] == 0 and r["json"] is not None:
            try:
                xs.append(pick(r["json"]))
            except (KeyError, TypeError, IndexError):
                pass
    return max(xs) if xs else None
fmt = lambda v: "-" if v is None else f"{v:.2f}"
print("family | layers, GiB | decode tok/s ours / llama.cpp (ratio) | prefill 512 tok/s ours / llama.cpp (ratio)")
for fam in dict.fromkeys(r["family"] for r in runs):
    lb_d = best(fam, "lb_decode", lambda o: o[0]["avg_ts"])
    lb_p = best(fam, "lb_prefill", lambda o: o[0]["avg_ts"])
    o_d = best(fam, "ours_decode", lambda o: o["decode"]["tokens_per_second"])
    o_p = best(fam, "ours_prefill", lambda o: o["decode"]["prefill_tokens_per_second"])
    ratio = lambda a, b: "-" if a is None or not b else f"{a / b:.2f}x"
    size = "-"
    for r in runs:
        if r["family"] == fam and r["run"] == "info":
            size = f'{r["layers"]}, {r["bytes"] / 2**30:.1f}'
    print(f"{fam} | {size} | {fmt(o_d)} / {fmt(lb_d)} ({ratio(o_d, lb_d)}) | {fmt(o_p)} / {fmt(lb_p)} ({ratio(o_p, lb_p)})")
PY
