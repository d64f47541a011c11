#!/usr/bin/env bash
# Ahead-of-time build of the shipped candidates (listed in CMakeLists.txt) into one libmini_kv_ops.so with CMake.
#
#   scripts/build_cmake.sh [BUILD_DIR] [extra cmake configure args...]
#
# BUILD_DIR defaults to build/cmake under the repository root. Torch is found through
# torch.utils.cmake_prefix_path of $PYTHON (default: python, else python3). The CUDA kernels are
# built when that torch has CUDA (override: -DMINI_KV_WITH_CUDA=OFF). On success the last line
# printed is the absolute path of the library, for torch.ops.load_library().
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${1:-$ROOT/build/cmake}"
[ $# -gt 0 ] && shift
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"

TORCH_PREFIX="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
mkdir -p "$BUILD_DIR"
BUILD_DIR="$(cd "$BUILD_DIR" && pwd)"

GENERATOR=()
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
  GENERATOR=(-G Ninja)  # only on first configure: a build dir keeps its generator
fi

cmake -S "$ROOT" -B "$BUILD_DIR" "${GENERATOR[@]}" \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DCMAKE_BUILD_TYPE=Release "$@" >&2
cmake --build "$BUILD_DIR" --parallel "$(nproc 2>/dev/null || echo 2)" >&2

LIB="$BUILD_DIR/libmini_kv_ops.so"
if [ ! -f "$LIB" ]; then
  echo "error: $LIB was not produced" >&2
  exit 1
fi
echo "$LIB"
