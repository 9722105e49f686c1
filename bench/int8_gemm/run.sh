#!/usr/bin/env bash
# Builds the standalone int8 GEMM check with nvcc (not through CMake) and runs it: bit-exact
# correctness against the CPU contract, then the timing table. Logs go under $OUT (set on the
# device machine; a local folder otherwise). Exit status is the harness's.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-out/int8_gemm}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv 2>&1 | tee "$OUT/gpu.txt" || true
# --fmad=false as the project's CUDA flags; the kernel uses explicit __fmaf_rn / __fmul_rn.
build() {  # build <binary> [extra nvcc flags...]
  local bin=$1
  shift
  nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -I. -Xptxas -v "$@" \
    bench/int8_gemm/int8_gemm_check.cu ops/int8_matmul/int8_gemm_cuda.cu core/error.cpp \
    -lcublas -o "$OUT/$bin" >"$OUT/$bin.build.log" 2>&1 || { cat "$OUT/$bin.build.log"; exit 1; }
}
# Tuning variants (timed on the anchors, sampled check only): stage depth and stage width.
build int8_gemm_check &
build int8_gemm_check_s6 -DQG_INT8_GEMM_STAGES=6 &
build int8_gemm_check_bk128 -DQG_INT8_GEMM_BK=128 -DQG_INT8_GEMM_STAGES=4 &
wait %1 && wait %2 && wait %3
grep -E "registers|spill" "$OUT/int8_gemm_check.build.log" | sort | uniq -c || true
set +e
"$OUT/int8_gemm_check" "$@" 2>&1 | tee "$OUT/int8_gemm_check.log"
rc=${PIPESTATUS[0]}
echo "exit status: $rc"
for v in s6 bk128; do
  echo "--- variant: $v"
  "$OUT/int8_gemm_check_$v" --timing-only 2>&1 | tail -20
done
exit "$rc"
