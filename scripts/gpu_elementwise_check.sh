#!/usr/bin/env bash
# On a GPU machine: build (build-gpu), check the element-wise quantization kernels
# (fake_quantize, ste_backward, LSQ, dynamic_range_quantize, INT4 / NF4 pack) against the
# CPU with `qat crosscheck --op`, run the GPU tests (memcheck over the fast-path tests when
# compute-sanitizer exists), then time their PERF.md cases. Six logs go to $OUT (or ./out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
if [ -d .gpudeps/root ] && [ ! -f /usr/include/eigen3/Eigen/Core ]; then cp -rn .gpudeps/root/. /; fi
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF >"$out/configure.log" 2>&1
cmake --build build-gpu -j "$(nproc)" --target qat test_gpu >"$out/build.log" 2>&1 ||
  { grep -E "error|warning" -A3 "$out/build.log" | head -60; echo "build failed"; exit 1; }
grep -E "warning" "$out/build.log" | head -20
rc=0
for op in fake_quantize ste_backward lsq_fake_quantize lsq_backward dynamic_range_quantize \
  int4_quantize_pack nf4_quantize_pack; do
  timeout 300 ./build-gpu/apps/qat crosscheck --op "$op" >>"$out/crosscheck.log" 2>&1 || { echo "crosscheck $op: FAILED"; rc=1; }
done
grep -E " FAIL |MISSING|error|summary" "$out/crosscheck.log" | head -40
timeout 300 ./build-gpu/tests/test_gpu >"$out/test_gpu.log" 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \] [A-Za-z]" "$out/test_gpu.log" | head -30
if command -v compute-sanitizer >/dev/null; then
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 99 ./build-gpu/tests/test_gpu \
    --gtest_filter='GpuFastPaths.*' >"$out/memcheck.log" 2>&1 || rc=1
  grep -E "ERROR SUMMARY" "$out/memcheck.log" | tail -1
fi
for f in "fq fwd" "lsq fwd+bwd" "dynamic int8" "int4 g128" "nf4 g64"; do
  ./build-gpu/apps/qat bench --device cuda --filter "$f" 2>&1 | tee -a "$out/bench.log" |
    grep -v "^qat bench\|^case"
done
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
echo "rc=$rc"
exit $rc
