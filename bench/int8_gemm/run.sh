#!/usr/bin/env bash
# Builds the standalone int8 GEMM check with nvcc (not through CMake) and runs it: bit-exact
# correctness against the CPU contract, the mma.sync ceiling, then the timing table. Logs go
# under $OUT (set on the device machine; a local folder otherwise). Exit status is the
# harness's. Extra arguments go to the harness (--no-timing, --timing-only).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-out/int8_gemm}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv 2>&1 | tee "$OUT/gpu.txt" || true
# --fmad=false as the project's CUDA flags; the kernel uses explicit __fmaf_rn / __fmul_rn.
nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -I. -Xptxas -v \
  bench/int8_gemm/int8_gemm_check.cu ops/int8_matmul/int8_gemm_cuda.cu core/error.cpp \
  -lcublas -o "$OUT/int8_gemm_check" >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
grep -E "registers|spill" "$OUT/build.log" | sort | uniq -c || true
set +e
"$OUT/int8_gemm_check" "$@" 2>&1 | tee "$OUT/int8_gemm_check.log"
rc=${PIPESTATUS[0]}
echo "exit status: $rc"
exit "$rc"
