#!/usr/bin/env bash
# Builds the standalone int8 GEMM check with nvcc (not through CMake) and runs it: bit-exact
# correctness against the CPU contract, the mma.sync ceiling, then the timing table. Logs go
# under $OUT (set on the device machine; a local folder otherwise). Exit status is the
# harness's. Extra arguments go to the harness (--no-timing, --timing-only).
# --ncu: instead, profiles one launch of each of a few anchor shapes with Nsight Compute
# (report text in $OUT/ncu.txt, per-instruction stall samples in $OUT/ncu_source.csv).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-out/int8_gemm}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv 2>&1 | tee "$OUT/gpu.txt" || true
# --fmad=false as the project's CUDA flags; the kernel uses explicit __fmaf_rn / __fmul_rn.
nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -I. -Xptxas -v -lineinfo \
  bench/int8_gemm/int8_gemm_check.cu ops/int8_matmul/int8_gemm_cuda.cu core/error.cpp \
  -lcublas -o "$OUT/int8_gemm_check" >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
grep -E "registers|spill" "$OUT/build.log" | sort | uniq -c || true
if [[ "${1:-}" == "--ncu" ]]; then
  ncu --clock-control none --cache-control none -k regex:int8_gemm_kernel \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section ComputeWorkloadAnalysis --section SchedulerStats --section InstructionStats \
    --section SourceCounters \
    --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed_pipe_tensor_op_imma.sum,sm__pipe_tensor_op_imma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,smsp__cycles_active.avg \
    --import-source no -o "$OUT/prof" -f "$OUT/int8_gemm_check" --ncu >"$OUT/ncu_run.log" 2>&1 || {
    tail -30 "$OUT/ncu_run.log"
    exit 1
  }
  ncu -i "$OUT/prof.ncu-rep" --print-details all >"$OUT/ncu.txt" 2>&1 || true
  ncu -i "$OUT/prof.ncu-rep" --page source --print-source sass --csv >"$OUT/ncu_source.csv" 2>&1 || true
  rm -f "$OUT/prof.ncu-rep"
  grep -E "^  [a-z_].*int8_gemm|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|bank_conflicts|imma|hit_rate" "$OUT/ncu.txt" || true
  exit 0
fi
set +e
"$OUT/int8_gemm_check" "$@" 2>&1 | tee "$OUT/int8_gemm_check.log"
rc=${PIPESTATUS[0]}
echo "exit status: $rc"
exit "$rc"
