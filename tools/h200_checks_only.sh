#!/bin/bash
# The op layer's GPU checks in one device call: llama.cpp's CUDA build in the
# background (tools/h200_peer_bench.sh's _build step), meanwhile
# tools/h200_device_checks.sh (gpu_ops, dflash, the glm and muse goldens)
# and, with PROFILE=1, tools/h200_kernel_profile.sh; once the build is done,
# with BENCH=1, tools/h200_family_bench.sh (REPS=2, the families of
# BENCH_FAMILIES, default all four; first, so that nothing runs beside its
# timings), then every family's goldens beside llama.cpp's CUDA build
# (tools/h200_goldens_cuda.sh for each of FAMILIES, default all four).
# Its parts, measured on an H100 in two calls: the build about 270 s (the
# checks meanwhile), the four families' benchmark about 90 s a repetition,
# the goldens about 90 s.
# $OUT gets checks.txt, profile.txt, while_building.txt, family_bench.txt, goldens_cuda*.txt,
# ours*.txt and build.txt, and all of them in one checks.tgz.
# Usage (repository root, GPU machine): BIN=.devbin SRC=.devsrc/llama-src.tar.xz
#   [PROFILE=1] [BENCH=1] bash tools/h200_checks_only.sh [BUILD_WAIT_S]
set -u
: "${BIN:?set BIN}" "${SRC:?set SRC}"
O=${OUT:-/tmp/o}; mkdir -p "$O"; S=${PEER_STATE:-/tmp/peer}; mkdir -p "$S"
if [ ! -f "$S/src/CMakeLists.txt" ]; then
  rm -rf "$S/src.tmp" && mkdir -p "$S/src.tmp" && tar -xJf "$SRC" -C "$S/src.tmp" && mv "$S/src.tmp/llama.cpp" "$S/src"
fi
if ! command -v nvcc > /dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break; done
fi
setsid nohup bash tools/h200_peer_bench.sh _build > "$S/build.log" 2>&1 < /dev/null &
t0=$(date +%s)
OUT=$O bash tools/h200_device_checks.sh > /dev/null 2>&1
[ "${PROFILE:-0}" = 1 ] && OUT=$O timeout 300 bash tools/h200_kernel_profile.sh > /dev/null 2>&1
# WHILE_BUILDING: a command of its own while llama.cpp builds (its output
# to while_building.txt), e.g. tools/h200_kernel_variants.sh.
[ -n "${WHILE_BUILDING:-}" ] && OUT=$O timeout 300 bash -c "$WHILE_BUILDING" > "$O/while_building.txt" 2>&1
while [ ! -f "$S/build.rc" ] && [ $(($(date +%s) - t0)) -lt "${1:-330}" ]; do sleep 3; done
echo "llama.cpp build rc=$(cat "$S/build.rc" 2> /dev/null || echo running) after $(($(date +%s) - t0)) s" | tee "$O/build.txt"
tail -n 30 "$S/build.log" > "$O/build.log"
if [ "$(cat "$S/build.rc" 2> /dev/null)" = 0 ]; then
  if [ "${BENCH:-0}" = 1 ]; then
    # shellcheck disable=SC2086 # a list of families
    OUT=$O REPS=${REPS:-2} BUDGET=${BENCH_BUDGET:-240} bash tools/h200_family_bench.sh \
      ${BENCH_FAMILIES:-muse_glimmer glm_moe_dsa glm5_next qwen4_exp} > "$O/bench.out" 2>&1
  fi
  for f in ${FAMILIES:-qwen4_exp glm_moe_dsa glm5_next muse_glimmer}; do
    OUT=$O FAMILY=$f timeout 200 bash tools/h200_goldens_cuda.sh >> "$O/goldens.log" 2>&1
  done
fi
(cd "$O" && tar czf checks.tgz --exclude=checks.tgz --exclude='*.bin' .)
exit 0
