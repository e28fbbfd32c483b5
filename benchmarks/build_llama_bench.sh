#!/usr/bin/env bash
# Build llama.cpp's own llama-bench (or another of its tools, named as the first
# argument: `build_llama_bench.sh llama-server` builds llama.cpp's OpenAI-compatible
# server, which `loopchat --url` can talk to) from the llama.cpp source vendored in the
# pinned llama-cpp-python sdist, with the same CPU flags as the Makefile, outside the
# repo. Prints the path of the binary. Used by benchmarks/loop_overhead.py --llama-bench and
# benchmarks/thread_pool_ab.py. Extra CMake flags: LLAMA_BENCH_CMAKE_ARGS (give such a build its
# own LLAMA_BENCH_DIR), e.g. the build without OpenMP that thread_pool_ab.py compares against:
#   LLAMA_BENCH_CMAKE_ARGS=-DGGML_OPENMP=OFF LLAMA_BENCH_DIR=~/.cache/loopchat/llama-bench-0.3.36-noomp-f16vecdot \
#     benchmarks/build_llama_bench.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=${LLAMA_CPP_VERSION:-0.3.36}
OUT=${LLAMA_BENCH_DIR:-$HOME/.cache/loopchat/llama-bench-$VERSION-f16vecdot}
TARGET=${1:-llama-bench}
if [ -x "$OUT/build/bin/$TARGET" ]; then echo "$OUT/build/bin/$TARGET"; exit 0; fi
mkdir -p "$OUT"
cd "$OUT"
if [ ! -d "llama_cpp_python-$VERSION" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d . >&2
  tar xzf "llama_cpp_python-$VERSION.tar.gz"
  # the Makefile's patch to the wheel's llama.cpp (issue 25: F16 matmuls through vec_dot at every
  # pass size, so a pass's logits do not depend on its number of positions): llama-bench and
  # llama-server, the peers loopchat is measured against, run the same kernels as loopchat's
  patch -d "llama_cpp_python-$VERSION/vendor/llama.cpp" -p1 <"$ROOT/patches/llama.cpp-sgemm-f16-vec-dot.patch" >&2
fi
SRC="$OUT/llama_cpp_python-$VERSION/vendor/llama.cpp"
FLAGS="-DGGML_NATIVE=OFF"
if [ "$(uname -m)" = x86_64 ]; then
  FLAGS="$FLAGS -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
FLAGS="$FLAGS ${LLAMA_BENCH_CMAKE_ARGS:-}"
[ -f build/CMakeCache.txt ] || cmake -S "$SRC" -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF $FLAGS >&2
cmake --build build --target "$TARGET" -j "$(nproc)" >&2
echo "$OUT/build/bin/$TARGET"
