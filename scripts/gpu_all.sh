#!/usr/bin/env bash
# Everything the GPU machine checks, in one call: build once, then the GPU test suite,
# `qat crosscheck` and compute-sanitizer (scripts/gpu_check.sh), the fused-kernel tests,
# the memory-plan / CUDA-graph tests, the compiled-step checks (scripts/gpu_steps_check.sh:
# `qat train` against `qat steps`), and the benchmark comparison against PyTorch.
# Keeps $OUT to a few files: all.log plus the benchmark JSON and table.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
export BUILD_DIR=build-gpu
logs=$(mktemp -d)
{
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF > "$logs/configure.log" 2>&1
  cmake --build build-gpu -j "$(nproc)" --target qat test_gpu test_gpu_fused test_passes test_memory_plan test_compile \
    > "$logs/build.log" 2>&1 || { grep -E "error" -A3 "$logs/build.log" | head -60; exit 1; }
  echo "==== fused-kernel tests"
  ./build-gpu/tests/test_gpu_fused --gtest_brief=1 2>&1 | tail -15
  [ -z "${SKIP_CHECK:-}" ] && OUT=$logs scripts/gpu_check.sh 2>&1 | tail -25
  echo "==== memory plan / CUDA graphs"
  OUT=$logs scripts/gpu_graph_check.sh 2>&1 | tail -12
  echo "==== compiled steps"
  OUT=$logs scripts/gpu_steps_check.sh 2>&1 | tail -20
  echo "==== benchmarks"
  OUT=$out scripts/gpu_bench.sh 2>&1 | tail -80
} 2>&1 | tee "$out/all.log"
