#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the source that the llama-cpp-python sdist vendors (no network besides
# PyPI), caching the binary under .build/ so reruns skip the ~7-minute compile. Prints the binary's path.
set -euo pipefail
VERSION=0.3.36
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${VELO_BUILD_DIR:-$ROOT/.build}"
BIN="$CACHE/llama.cpp-build/bin/llama-server"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$CACHE/src"
if [ ! -d "$CACHE/src/llama_cpp_python-$VERSION" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE/src" >&2
  tar xzf "$CACHE/src/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE/src"
fi
# Without ggml's AMX kernels: on the Firecracker VMs these tests run on, the CPU lists AMX and the kernel grants
# it, yet ggml's tile kernels die on their first batch (SIGILL at `tilezero`, or a general protection fault).
# `-U` takes the macro that -march=native predefines, which is all that compiles them in.
NO_AMX="-U__AMX_INT8__"
cmake -S "$CACHE/src/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$CACHE/llama.cpp-build" \
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$CACHE/llama.cpp-build" --target llama-server -j"$(nproc)" >&2
echo "$BIN"
