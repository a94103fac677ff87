#!/bin/bash
# Ours against llama.cpp in one machine session (issue 25, "A peer in the same run").
# Usage (repository root, on the GPU machine; the two commands back to back,
# the second within 30 s of the first):
#   BIN=.devbin SRC=.devsrc/llama-src.tar.xz bash tools/h200_peer_bench.sh a
#   BIN=.devbin SRC=.devsrc/llama-src.tar.xz bash tools/h200_peer_bench.sh b
# BIN: qwen4_exp and seam built here (plain or .gz). SRC: the stripped llama.cpp
# tree of tools/peer/make_llama_src.sh. State lives in /tmp/peer; every step
# is skipped when its result exists, so a phase can be rerun (b again: only
# what is missing, then the summary).
#  a: starts the llama.cpp CUDA build in the background (about 240 s on 16
#     cores), writes the generated model (20 layers, 23.5 GiB; fewer if the
#     disk is short), rewrites its tokenizer model test -> none in place, runs
#     ours' 8 greedy steps (untimed, while the build runs), waits for the
#     build, then times ours. Ours is timed only with the build finished: the
#     build takes all cores and ours' decode is bound by one host thread
#     launching kernels; runs left over go to phase b.
#  b: waits for the build, runs llama-bench (decode, prefill), greedy_top2
#     (warm and cold first token, 8 greedy steps on CUDA and on the CPU, there
#     also with F32 K/V caches),
#     whatever ours still lacks, and the summary.
# $OUT gets summary.txt, ours.jsonl, llama.jsonl, progress.log, build.log
# (tail), errs.txt (stderr tails). Knobs for a CPU rehearsal (defaults for
# the H200): DEV=cuda STAGE=all CUDA=ON NGL=999 LAYERS=20 REPS=3 DECODE_STEPS=33
# PREFILL_N=512 LB_N=32 DROP=1 JOBS=nproc BUDGET=560 WAIT_A=330 WAIT_B=330.
set -u
source "$(dirname "$0")/h200_lib.sh"
PHASE=${1:?phase: a or b}
B=${BIN:?set BIN to the folder of the release binaries}
SRC=${SRC:?set SRC to the llama.cpp source tarball}
SRC=$(readlink -f "$SRC"); B=$(readlink -f "$B")
O=${OUT:-/tmp/o}; mkdir -p "$O"
S=${PEER_STATE:-/tmp/peer}; mkdir -p "$S/runs" "$S/bin"
R=$(pwd); SELF=$(readlink -f "$0"); PY=$R/tools/peer/peer_summary.py
DEV=${DEV:-cuda}; STAGE=${STAGE:-all}; CUDA=${CUDA:-ON}; NGL=${NGL:-999}; LAYERS=${LAYERS:-20}; REPS=${REPS:-3}
DSTEPS=${DECODE_STEPS:-33}; PN=${PREFILL_N:-512}; LBN=${LB_N:-32}; DROP=${DROP:-1}
JOBS=${JOBS:-$(nproc)}; BUDGET=${BUDGET:-560}; WAIT_A=${WAIT_A:-330}; WAIT_B=${WAIT_B:-330}
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
say() { echo "[$PHASE +$(el)s] $*" | tee -a "$S/progress.log"; }

if ! command -v nvcc > /dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break
  done
fi

# The llama.cpp build (run in the background by phase a/b as `... _build`).
if [ "$PHASE" = _build ]; then
  cd "$S" || exit 1
  G=Ninja; command -v ninja > /dev/null || G="Unix Makefiles"
  CC_NVCC=(); command -v nvcc > /dev/null && CC_NVCC=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
  t0=$(date +%s)
  cmake -S src -B build -G "$G" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA="$CUDA" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA_ALL_QUANTS=OFF -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON "${CC_NVCC[@]}" &&
    cmake --build build --target llama-bench -j "$JOBS" &&
    g++ -O2 -std=c++17 "$R/tools/peer/greedy_top2.cpp" -Isrc/include -Isrc/ggml/include \
      -Lbuild/bin -lllama -lggml -lggml-base -Wl,-rpath,"$S/build/bin" -o build/bin/greedy_top2.tmp &&
    mv build/bin/greedy_top2.tmp build/bin/greedy_top2 &&
    g++ -O1 -std=c++17 "$R/tools/oracle/dump_tensors.cpp" -Isrc/include -Isrc/ggml/include \
      -Lbuild/bin -lllama -lggml -lggml-base -Wl,-rpath,"$S/build/bin" -o build/bin/dump_tensors
  rc=$?
  echo "build rc=$rc in $(($(date +%s) - t0)) s"
  echo "$rc" > build.rc
  exit "$rc"
fi
case $PHASE in a | b) ;; *) echo "phase: a or b" >&2; exit 2 ;; esac

# shellcheck disable=SC2329 # run by the EXIT trap
finish() {
  python3 "$PY" summary "$S" > "$S/summary.txt" 2>&1
  cp "$S/summary.txt" "$S/progress.log" "$O/" 2>/dev/null
  for f in ours.jsonl llama.jsonl; do [ -f "$S/$f" ] && cp "$S/$f" "$O/"; done
  [ -f "$S/build.log" ] && tail -n 150 "$S/build.log" > "$O/build.log"
  for e in "$S"/runs/*.err; do
    [ -s "$e" ] && { echo "== $(basename "$e")"; grep -v ': policy: ' "$e" | tail -n 4; }
  done > "$O/errs.txt" 2>/dev/null
  echo "----- summary"; cat "$S/summary.txt"
}
trap finish EXIT

# libnvrtc for our binaries (tools/h200_lib.sh); only on our runs'
# LD_LIBRARY_PATH, so llama.cpp keeps its own CUDA libraries.
if [ ! -f "$S/nvrtc_path" ]; then
  nvrtc_ld_path > "$S/nvrtc_path" || say "no libnvrtc.so* found: ours' --device cuda will fail"
fi
NVLP=$(cat "$S/nvrtc_path"):${LD_LIBRARY_PATH:-}

bin() { unpack_bin "$B" "$1" "$S/bin"; }
QW=$(bin qwen4_exp) || { say "no qwen4_exp in $B"; exit 1; }
SEAM=$(bin seam) || { say "no seam in $B"; exit 1; }
Q=$S/q.gguf; LB=$S/build/bin/llama-bench; GT=$S/build/bin/greedy_top2

brun() { [ -f "$S/build.pid" ] && [ ! -f "$S/build.rc" ] && kill -0 "$(cat "$S/build.pid")" 2> /dev/null; }
built() { [ -f "$S/build.rc" ] && [ "$(cat "$S/build.rc")" = 0 ] && [ -x "$GT" ] && [ -x "$LB" ]; }
build_start() {
  if built; then say "llama.cpp build: done before"; return; fi
  if brun; then say "llama.cpp build: running"; return; fi
  rm -f "$S/build.rc"
  if [ ! -f "$S/src/CMakeLists.txt" ]; then
    rm -rf "$S/src" "$S/src.tmp"; mkdir -p "$S/src.tmp"
    if ! { tar -xJf "$SRC" -C "$S/src.tmp" && mv "$S/src.tmp/llama.cpp" "$S/src"; }; then
      say "cannot unpack $SRC"; return 1
    fi
  fi
  setsid nohup bash "$SELF" _build >> "$S/build.log" 2>&1 < /dev/null &
  echo $! > "$S/build.pid"
  say "llama.cpp build started (pid $!, $JOBS jobs)"
}
build_wait() { # UNTIL: elapsed seconds of this phase
  local n=0
  while brun && [ "$(el)" -lt "$1" ]; do
    sleep 5; n=$((n + 1))
    [ $((n % 6)) = 0 ] && say "build: $(tail -c 300 "$S/build.log" | tr '\r' '\n' | grep . | tail -1 | cut -c1-100)"
  done
  if built; then say "llama.cpp build done"; return 0; fi
  if brun; then say "llama.cpp build still running"; else say "llama.cpp build FAILED: $(tail -n 3 "$S/build.log" | tr '\n' ' ' | cut -c1-300)"; fi
  return 1
}

have() { grep -q "\"name\": \"$2\", \"rc\": 0," "$S/$1" 2> /dev/null; }
# run FILE NAME NEED TIMEOUT CMD...: skipped when done before, or when less
# than NEED seconds of the phase are left; extra k=v fields from $EXTRA.
run() {
  local f=$1 n=$2 need=$3 to=$4 t0 t1 rc left
  shift 4
  if have "$f" "$n"; then return 0; fi
  left=$((BUDGET - $(el) - 10))
  [ "$to" -gt "$left" ] && to=$left
  if [ "$to" -lt "$need" ]; then say "$n: skipped, $left s left"; return 1; fi
  t0=$(date +%s.%N)
  timeout -k 5 "$to" "$@" > "$S/runs/$n.out" 2> "$S/runs/$n.err"
  rc=$?
  t1=$(date +%s.%N)
  # shellcheck disable=SC2086
  python3 "$PY" rec "$S/$f" "$n" "$rc" "$t0" "$t1" "$S/runs/$n.out" "build_running=$(brun && echo true || echo false)" ${EXTRA:-}
  say "$n rc=$rc $(python3 -c "print(f'{$t1 - $t0:.2f}')") s"
  return "$rc"
}
cold() { # drop the model's pages; prints the k=v fields that say whether it worked
  local before after drop=failed res
  sync
  before=$(awk '/^Cached:/{print $2}' /proc/meminfo)
  if [ "$DROP" = 1 ] && { echo 3 > /proc/sys/vm/drop_caches; } 2> /dev/null; then drop=ok; fi
  python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$Q"
  after=$(awk '/^Cached:/{print $2}' /proc/meminfo)
  res=$(fincore -b -n -o RES "$Q" 2> /dev/null | awk '{print $1}')
  echo "cached_before_kb=$before cached_after_kb=$after drop=$drop resident_after=${res:-unknown}"
}
ours() { # NAME NEED TIMEOUT ARGS...
  local n=$1 need=$2 to=$3
  shift 3
  run ours.jsonl "$n" "$need" "$to" env LD_LIBRARY_PATH="$NVLP" "$QW" "$Q" --device "$DEV" --stage "$STAGE" --json "$@"
}
P512=$(prompt_ids "$PN" 248320)
ours_timed() {
  local i
  for i in $(seq "$REPS"); do ours "ours_decode_$i" 20 150 --tokens 1,2,3 --steps "$DSTEPS"; done
  for i in $(seq "$REPS"); do ours "ours_prefill_$i" 20 150 --tokens "$P512" --steps 1; done
  for i in $(seq "$REPS"); do ours "ours_warm_$i" 20 120 --tokens 1,2,3 --steps 1; done
  for i in 1 2; do run ours.jsonl "seam_load_$i" 15 120 env LD_LIBRARY_PATH="$NVLP" "$SEAM" load "$Q" --device "$DEV" --json; done
  if ! have ours.jsonl ours_cold && [ $((BUDGET - $(el))) -gt 90 ]; then
    EXTRA=$(cold) ours ours_cold 60 240 --tokens 1,2,3 --steps 1
  fi
}

say "phase $PHASE: state $S, bin $B, device $DEV, $(nproc) cores, disk free $(df -Pk "$S" | awk 'NR==2{printf "%.1f GiB", $4/1048576}')"
build_start

if [ "$PHASE" = a ]; then
  if [ ! -f "$Q" ]; then
    if [ ! -f "$S/layers" ]; then
      # the file is about 0.94 + 1.13 * layers GiB; keep 6 GiB for the build and the rest
      free_g=$(($(df -Pk "$S" | awk 'NR==2{print $4}') / 1048576))
      max=$(((free_g - 7) * 100 / 113)); n=$LAYERS; [ "$max" -lt "$n" ] && n=$max
      [ "$n" -ge 1 ] || { say "disk too small: $free_g GiB free"; exit 1; }
      echo "$n" > "$S/layers"
    fi
    rm -f "$S/q.tmp.gguf"
    say "writing the generated model, $(cat "$S/layers") layers"
    timeout 400 "$QW" --write-generated "$S/q.tmp.gguf" --layers "$(cat "$S/layers")" > "$S/runs/write.out" 2>&1 ||
      { say "write-generated failed: $(tail -n 2 "$S/runs/write.out")"; exit 1; }
    python3 "$R/tools/peer/gguf_tok_none.py" "$S/q.tmp.gguf" | tee -a "$S/progress.log" || exit 1
    mv "$S/q.tmp.gguf" "$Q"
    say "model: $(stat -c %s "$Q") bytes; tokenizer: $("$SEAM" inspect "$Q" 2> /dev/null | grep -m1 tokenizer.ggml.model | tr -s ' ')"
  fi
  if ! have ours.jsonl info; then
    gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2> /dev/null | head -1)
    python3 "$PY" rec "$S/ours.jsonl" info 0 0 0 /dev/null "layers=$(cat "$S/layers")" "file_bytes=$(stat -c %s "$Q")" "gpu=${gpu:-none}" "cores=$(nproc)"
  fi
  ours ours_check8 20 240 --tokens 1,2,3 --steps 8
  build_wait "$WAIT_A"
  if brun; then say "timed runs of ours left to phase b (the build still runs)"; else ours_timed; fi
  exit 0
fi

# phase b
[ -f "$Q" ] || { say "no model at $Q: run phase a first"; exit 1; }
if ! build_wait "$WAIT_B"; then
  ours ours_check8 20 240 --tokens 1,2,3 --steps 8
  brun || ours_timed
  exit 1
fi
run llama.jsonl lb_decode 20 150 "$LB" -m "$Q" -ngl "$NGL" -p 0 -n "$LBN" -r "$REPS" -o json
run llama.jsonl lb_prefill 20 150 "$LB" -m "$Q" -ngl "$NGL" -p "$PN" -n 0 -r "$REPS" -o json
for i in $(seq "$REPS"); do run llama.jsonl "gt_warm_$i" 15 120 "$GT" "$Q" 1,2,3 1 "$NGL"; done
run llama.jsonl gt_gpu8 15 120 "$GT" "$Q" 1,2,3 8 "$NGL"
if ! have llama.jsonl gt_cold && [ $((BUDGET - $(el))) -gt 90 ]; then
  EXTRA=$(cold) run llama.jsonl gt_cold 60 240 "$GT" "$Q" 1,2,3 1 "$NGL"
fi
# llama.cpp's CPU path: no GPU visible; if that fails, ngl 0 with the GPU visible
EXTRA=cuda_visible=none run llama.jsonl gt_cpu8 20 200 env CUDA_VISIBLE_DEVICES= "$GT" "$Q" 1,2,3 8 0 ||
  EXTRA=cuda_visible=all run llama.jsonl gt_cpu8 20 200 "$GT" "$Q" 1,2,3 8 0
# the same with F32 K/V caches and no flash attention (llama.cpp's own spread)
EXTRA=cuda_visible=none run llama.jsonl gt_cpu8_kvf32 20 200 env CUDA_VISIBLE_DEVICES= "$GT" "$Q" 1,2,3 8 0 --kv-f32
ours ours_check8 20 240 --tokens 1,2,3 --steps 8
ours_timed
exit 0
