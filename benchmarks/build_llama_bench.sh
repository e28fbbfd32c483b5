#!/usr/bin/env bash
# Build llama.cpp's own llama-bench (or another of its tools, named as the first
# argument: `build_llama_bench.sh llama-server` builds llama.cpp's OpenAI-compatible
# server, which `loopchat --url` can talk to) from the llama.cpp source vendored in the
# pinned llama-cpp-python sdist, with the same CPU flags as the Makefile, outside the
# repo. Prints the path of the binary. Used by benchmarks/loop_overhead.py --llama-bench and
# benchmarks/thread_pool_ab.py. Extra CMake flags: LLAMA_BENCH_CMAKE_ARGS (give such a build its
# own LLAMA_BENCH_DIR), e.g. the build without OpenMP that thread_pool_ab.py compares against:
#   LLAMA_BENCH_CMAKE_ARGS=-DGGML_OPENMP=OFF LLAMA_BENCH_DIR=~/.cache/loopchat/llama-bench-0.3.36-noomp-nollamafile \
#     benchmarks/build_llama_bench.sh
set -euo pipefail
VERSION=${LLAMA_CPP_VERSION:-0.3.36}
OUT=${LLAMA_BENCH_DIR:-$HOME/.cache/loopchat/llama-bench-$VERSION-nollamafile}
TARGET=${1:-llama-bench}
if [ -x "$OUT/build/bin/$TARGET" ]; then echo "$OUT/build/bin/$TARGET"; exit 0; fi
mkdir -p "$OUT"
cd "$OUT"
if [ ! -d "llama_cpp_python-$VERSION" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d . >&2
  tar xzf "llama_cpp_python-$VERSION.tar.gz"
fi
SRC="$OUT/llama_cpp_python-$VERSION/vendor/llama.cpp"
# GGML_LLAMAFILE=OFF as in the Makefile's wheel (issue 25: tinyBLAS served only passes of 2+
# positions, so their logits were not a one-position pass's): llama-bench and llama-server,
# the peers loopchat is measured against, run the same kernels as loopchat's llama.cpp.
FLAGS="-DGGML_NATIVE=OFF -DGGML_LLAMAFILE=OFF"
if [ "$(uname -m)" = x86_64 ]; then
  FLAGS="$FLAGS -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
FLAGS="$FLAGS ${LLAMA_BENCH_CMAKE_ARGS:-}"
[ -f build/CMakeCache.txt ] || cmake -S "$SRC" -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF $FLAGS >&2
cmake --build build --target "$TARGET" -j "$(nproc)" >&2
echo "$OUT/build/bin/$TARGET"
