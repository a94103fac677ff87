#!/usr/bin/env bash
# Build the oracle (llama.cpp from the llama-cpp-python 0.3.36 sdist: the
# libraries, test-llama-archs, libmtmd and tools/oracle/mm_encode.cpp) on a
# many-core machine without network, then run fixtures_muse_glm5.sh.
#
#   tools/oracle/device_oracle.sh SLIM.tar.gz OUT_DIR
#
# SLIM.tar.gz: `llama_cpp/` and `vendor/llama.cpp/` of the sdist (models/,
# docs/ and unused backends left out to stay small). The Python side needs
# numpy and jinja2; diskcache (imported by llama_cpp, unused here) is stubbed.
set -euo pipefail
TGZ=$1; OUTD=$2
HERE=$(cd "$(dirname "$0")" && pwd)
W=${WORK:-/tmp/lcpdev}
mkdir -p "$W" "$OUTD"
t0=$(date +%s)
tar xzf "$TGZ" -C "$W"
LC=$W/vendor/llama.cpp
cmake -S "$LC" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON > "$OUTD/cmake.log" 2>&1
ninja -C "$W/build" test-llama-archs llama mtmd > "$OUTD/ninja.log" 2>&1 || { tail -50 "$OUTD/ninja.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
g++ -O2 -std=c++17 "$HERE/mm_encode.cpp" -I"$LC/tools/mtmd" -I"$LC/include" -I"$LC/ggml/include" \
    -L"$W/build/bin" -lmtmd -lllama -lggml -lggml-base -Wl,-rpath,"$W/build/bin" -o "$W/mm_encode"
mkdir -p "$W/stub"
echo "class Cache: pass" > "$W/stub/diskcache.py"
PYTHONPATH="$W/stub" RAW_DIR="$W/raw" "$HERE/fixtures_muse_glm5.sh" "$W/build/bin" "$W" "$OUTD" "$W/mm_encode"
echo "total: $(( $(date +%s) - t0 )) s"
