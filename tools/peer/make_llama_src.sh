#!/bin/bash
# Usage: tools/peer/make_llama_src.sh [OUT.tar.xz] [WORKDIR]
# The llama.cpp tree vendored in llama-cpp-python 0.3.36, stripped to what a
# CUDA (or CPU) build of libllama + llama-bench needs, as a reproducible
# tar.xz (default /work/main/.devsrc/llama-src.tar.xz; about 1.8 MB).
# Kept: CMakeLists.txt, cmake/, LICENSE, licenses/, include/, src/, common/,
# ggml/ with only the CPU and CUDA backends, vendor/ (miniaudio.h, used only
# by tools/mtmd, left out), tools/llama-bench, with tools/CMakeLists.txt
# rewritten to add only llama-bench. Build it with LLAMA_BUILD_TESTS,
# _EXAMPLES, _SERVER, _APP off (tools/h200_peer_bench.sh does).
# The sdist comes with `pip download --no-binary llama-cpp-python --no-deps`
# (`--no-binary :all:` also compiles cmake from source to read the sdist's
# metadata: 15+ min); its sha256 is checked.
set -eu
OUT=${1:-/work/main/.devsrc/llama-src.tar.xz}
W=${2:-/tmp/peer-src}
SHA=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
mkdir -p "$W" "$(dirname "$OUT")"
SD=$W/llama_cpp_python-0.3.36.tar.gz
[ -f "$SD" ] || pip download --no-binary llama-cpp-python --no-deps llama-cpp-python==0.3.36 -d "$W"
echo "$SHA  $SD" | sha256sum -c -
rm -rf "$W/x" "$W/llama.cpp"; mkdir -p "$W/x"
tar -xzf "$SD" -C "$W/x" llama_cpp_python-0.3.36/vendor/llama.cpp
S=$W/x/llama_cpp_python-0.3.36/vendor/llama.cpp
D=$W/llama.cpp; mkdir -p "$D/ggml/src" "$D/tools"
cp -a "$S"/{CMakeLists.txt,LICENSE,cmake,licenses,include,src,common,vendor} "$D/"
rm -f "$D/vendor/miniaudio/miniaudio.h"
cp -a "$S"/ggml/{CMakeLists.txt,cmake,include} "$D/ggml/"
find "$S/ggml/src" -maxdepth 1 -type f -exec cp -a {} "$D/ggml/src/" \;
cp -a "$S"/ggml/src/{ggml-cpu,ggml-cuda} "$D/ggml/src/"
cp -a "$S/tools/llama-bench" "$D/tools/"
cat > "$D/tools/CMakeLists.txt" <<'CM'
# stripped by seam's tools/peer/make_llama_src.sh: only llama-bench
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
CM
du -sh "$D"
tar -C "$W" --sort=name --mtime=2026-01-01 --owner=0 --group=0 --numeric-owner \
    -cf - llama.cpp | xz -9 -T1 > "$OUT"
ls -l "$OUT"; sha256sum "$OUT"
