#!/bin/bash
# Makes the folder tools/h200_wheel_bench.py takes on the GPU machine
# (which has Python, PyTorch and NumPy, but no Rust and no network), here:
#   seam-*.whl      the package, release build, stripped (abi3, CPython
#                   3.10+, manylinux tag from maturin's glibc check)
#   gguf-py.tar.gz  llama.cpp's gguf-py (from the llama-cpp-python sdist)
# (the wheel itself writes the generated model there: no xtask to carry)
# Usage (from the repository root): bash tools/h200_wheel_pack.sh DIR
#   LCP_SDIST   the sdist (default /tmp/lcp/llama_cpp_python-0.3.36.tar.gz)
#   MATURIN     maturin (default: the one `cargo xtask test` installs in
#               target/python-venv, else maturin on PATH)
# DIR must be an ignored folder of the repository (target/h200-wheel) so the
# device run can carry it; the script prints its size.
set -euo pipefail
DIR=${1:?usage: bash tools/h200_wheel_pack.sh DIR}
LCP_SDIST=${LCP_SDIST:-/tmp/lcp/llama_cpp_python-0.3.36.tar.gz}
VENV_BIN=$(pwd)/target/python-venv/bin
if [ -z "${MATURIN:-}" ]; then
  if [ -x "$VENV_BIN/maturin" ]; then MATURIN=$VENV_BIN/maturin; else MATURIN=maturin; fi
fi
mkdir -p "$DIR"
rm -f "$DIR"/seam-*.whl
# maturin picks the interpreter on PATH; any CPython 3.10+ will do (abi3).
PATH=$VENV_BIN:$PATH "$MATURIN" build --release --strip \
  --manifest-path bindings/python/Cargo.toml --out "$DIR"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
tar -xzf "$LCP_SDIST" -C "$TMP" --wildcards '*/vendor/llama.cpp/gguf-py/gguf/*' '*/vendor/llama.cpp/gguf-py/LICENSE'
GGUF_PY=$(find "$TMP" -type d -path '*/vendor/llama.cpp/gguf-py' | head -1)
tar -czf "$DIR/gguf-py.tar.gz" -C "$(dirname "$GGUF_PY")" gguf-py
ls -la "$DIR"
du -sh "$DIR"
