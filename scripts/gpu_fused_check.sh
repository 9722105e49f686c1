#!/usr/bin/env bash
# On the GPU machine: build, run the fused-kernel GPU tests, then the benchmark comparison.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF > /tmp/qg_configure.log 2>&1
cmake --build build-gpu -j "$(nproc)" --target qat test_gpu_fused test_passes > /tmp/qg_build.log 2>&1 \
  || { grep -E "error" -A3 /tmp/qg_build.log | head -60; exit 1; }
./build-gpu/tests/test_gpu_fused --gtest_brief=1 2>&1 | tail -60 | tee "$out/test_gpu_fused.txt"
./build-gpu/tests/test_passes 2>&1 | tail -3
scripts/gpu_bench.sh
