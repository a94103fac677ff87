#!/usr/bin/env bash
# Build the numerical oracle: llama.cpp as vendored by PyPI
# llama-cpp-python==0.3.36 (CPU only), plus its tests/test-llama-archs binary.
#
#   tools/oracle/build_llama.sh [WORKDIR]       (default WORKDIR=/tmp/lcp)
#
# Steps (each skipped when its output already exists):
#   1. pip download the sdist (only llama-cpp-python from source; its build
#      deps cmake/ninja/scikit-build-core come as wheels -- `--no-binary :all:`
#      would compile cmake itself from source, ~15 extra minutes).
#   2. pip install it from that sdist with a PERSISTENT CMake build dir
#      (WORKDIR/build), CPU only, no mtmd/llava (not needed for text logits;
#      llama_cpp imports mtmd lazily). Measured 5.6 min (337 s) on this
#      workplace's 2-core machine under `nice -n 19`, no ccache (src/models is
#      a unity build); budget 15-25 min on a busy machine or with mtmd on.
#   3. Re-configure the same build dir with LLAMA_BUILD_TESTS=ON and build only
#      the `test-llama-archs` target (incremental: ggml/llama objects are
#      reused; only common/ + the test compile). Binary ends up in
#      WORKDIR/build/bin/test-llama-archs (or vendor/llama.cpp/bin under it).
#
# Env: JOBS (default: nproc), PYTHON (default: python3), SKIP_TESTS=1.
# Log: WORKDIR/build.log (timings are printed there as well).
set -euo pipefail

WORK=${1:-/tmp/lcp}
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
VER=0.3.36
SRC=$WORK/llama_cpp_python-$VER
BUILD=$WORK/build
mkdir -p "$WORK"
LOG=$WORK/build.log
exec > >(tee -a "$LOG") 2>&1

t0=$(date +%s)
stamp() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - t0 ))s] $*"; }

# 1. sdist
if [ ! -f "$WORK/llama_cpp_python-$VER.tar.gz" ]; then
    stamp "downloading sdist"
    "$PY" -m pip download --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$VER" -d "$WORK"
fi
if [ ! -d "$SRC" ]; then
    tar xzf "$WORK/llama_cpp_python-$VER.tar.gz" -C "$WORK"
fi
test -f "$SRC/vendor/llama.cpp/src/models/qwen4exp.cpp" \
    || { echo "qwen4exp.cpp missing from the vendored tree"; exit 2; }

# 2. the Python package (CPU). CMAKE_ARGS reach the vendored llama.cpp.
if ! "$PY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VER')" 2>/dev/null; then
    stamp "pip install llama-cpp-python==$VER from source (jobs=$JOBS)"
    export CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON"
    export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
    # Build tools installed for real (not an isolated build env) so that the
    # cmake/ninja paths recorded in $BUILD/CMakeCache.txt stay valid for step 3.
    "$PY" -m pip install 'scikit-build-core[pyproject]>=0.9.2' 'cmake>=3.21' ninja
    nice -n 19 "$PY" -m pip install --no-deps --no-build-isolation -v \
        --config-settings=build-dir="$BUILD" \
        "$SRC"
    "$PY" -m pip install 'numpy>=1.20' 'typing-extensions>=4.5' 'diskcache>=5.6.1' 'jinja2>=2.11.3'
    stamp "pip install done"
else
    stamp "llama_cpp $VER already importable; skipping pip build"
fi

# 3. test-llama-archs from the same build tree
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    if [ -f "$BUILD/CMakeCache.txt" ]; then
        stamp "building test-llama-archs in $BUILD"
        nice -n 19 cmake -S "$SRC" -B "$BUILD" -DLLAMA_BUILD_TESTS=ON >/dev/null
        nice -n 19 cmake --build "$BUILD" --target test-llama-archs -j "$JOBS"
    else
        # Fallback: a standalone build of the vendored tree.
        stamp "no pip build dir; standalone CMake build of vendor/llama.cpp"
        nice -n 19 cmake -S "$SRC/vendor/llama.cpp" -B "$WORK/build-standalone" \
            -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=ON \
            -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
        nice -n 19 cmake --build "$WORK/build-standalone" --target test-llama-archs -j "$JOBS"
    fi
    find "$WORK" -name test-llama-archs -type f -perm -u+x | head -1
    stamp "test-llama-archs done"
fi
stamp "all done"
