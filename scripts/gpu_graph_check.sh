#!/usr/bin/env bash
# On a GPU machine: build with CUDA and run the memory-planner and CUDA-graph tests
# (tests/memory_plan: CPU planner tests plus GpuCudaGraph.*, which replay captured steps and
# compare them bit for bit with plain launches), then `qat memplan` for the GPU shapes.
# Writes at most three files to $OUT (or ./out); prints a short summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
build=${BUILD_DIR:-build-graphcheck}
summary=()
note() { summary+=("$1"); }

if [ -d .gpudeps/root ] && [ ! -f /usr/include/eigen3/Eigen/Core ]; then
  cp -rn .gpudeps/root/. / && note "deps: copied .gpudeps/root under /"
fi
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"

t0=$(date +%s)
{
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_ENABLE_CUDA=ON -DQG_BUILD_BENCH=OFF &&
    cmake --build "$build" -j "$(nproc)" --target qat test_memory_plan
} >"$out/graph_build.log" 2>&1
if [ $? -ne 0 ]; then
  grep -E "error" -A4 "$out/graph_build.log" | head -60
  echo "SUMMARY: build failed"
  exit 1
fi
note "build: $(($(date +%s) - t0)) s"

timeout "${T_TESTS:-300}" "$build"/tests/test_memory_plan >"$out/graph_tests.log" 2>&1
rc=$?
grep -E '^\[  FAILED  \] [A-Za-z]|Failure|error' "$out/graph_tests.log" | head -30
note "test_memory_plan: rc=$rc; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]' "$out/graph_tests.log" | tr '\n' ' ')"
note "GPU tests run: $(grep -cE '^\[       OK \] GpuCudaGraph' "$out/graph_tests.log"), skipped: $(grep -cE '^\[  SKIPPED \] GpuCudaGraph' "$out/graph_tests.log")"

timeout 200 "$build"/apps/qat memplan --time 200 >"$out/memplan.txt" 2>&1
note "qat memplan: rc=$?"
cat "$out/memplan.txt"

echo
echo "SUMMARY:"
for s in "${summary[@]}"; do echo "  $s"; done
