#!/usr/bin/env bash
# On the 2-GPU machine, one call: the 207M Llama step (bf16-mixed, batch 8 x 1024 per GPU) on
# one GPU and data-parallel on two (`qat steps --model llama --nproc 2`, NCCL), float and the
# 8da4w recipe (RECIPE), with the gradient all-reduce on and off (the off rows bound how much of
# it the backward pass hides); then PyTorch DDP and torchao 8da4w on the same shapes
# (bench/torch_llama_ddp_bench.py). RUN_TESTS=1 also runs the NCCL tests of test_distributed
# first. MODES (default "1gpu 2gpu 2gpu-nosync") may add 2gpu-bf16: the 2-GPU step with the
# gradients all-reduced in bf16 (--grad-reduce-dtype bf16, half the bytes; PyTorch's bf16
# model sends its bf16 gradients), and 2gpu-bf16-200: the same in 200 MiB buckets (two, as the
# f32 default makes); 2gpu-mbN: f32 buckets of N MiB. QAT_BIN: a qat binary built elsewhere (no build here).
# Logs go to $OUT; the rows are printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
build=${BUILD_DIR:-build-dist}
[ -d .gpudeps/root ] && [ ! -f /usr/include/eigen3/Eigen/Core ] && cp -rn .gpudeps/root/. / 2>/dev/null
# The digits data for the NCCL tests: the GPU image's sklearn ships the same CSV.
if [ -z "${QG_DIGITS_CSV:-}" ] && [ ! -f /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz ]; then
  QG_DIGITS_CSV=$(python3 -c "import os, sklearn; print(os.path.join(os.path.dirname(sklearn.__file__), 'datasets', 'data', 'digits.csv.gz'))" 2>/dev/null) && export QG_DIGITS_CSV
fi
nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' '
echo
t0=$(date +%s)
if [ -z "${QAT_BIN:-}" ] || [ -n "${RUN_TESTS:-}" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF -DQG_ENABLE_ONNX=OFF \
    -DQG_ENABLE_SENTENCEPIECE=OFF -DPython3_EXECUTABLE="$(command -v python3)" >"$out/configure.log" 2>&1 ||
    { tail -30 "$out/configure.log"; exit 1; }
  targets=(qat)
  [ -n "${RUN_TESTS:-}" ] && targets+=(dist_worker test_distributed)
  cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$out/build.log" 2>&1 ||
    { grep -E "error" -A4 "$out/build.log" | head -40; exit 1; }
  echo "build: $(($(date +%s) - t0)) s; $(grep -E 'qatgraph: NCCL' "$out/configure.log")"
  inc=$(grep -E '^QG_NCCL_INCLUDE' "$build/CMakeCache.txt" | cut -d= -f2)
  echo "nccl.h: $(grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH)' "$inc/nccl.h" | awk '{print $3}' | tr '\n' '.')"
fi
qat=${QAT_BIN:-$build/apps/qat}
[ -n "${QAT_BIN:-}" ] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if [ -n "${RUN_TESTS:-}" ]; then
  QG_TEST_GPUS=2 timeout 240 "$build"/tests/test_distributed --gtest_filter='Nccl*' \
    >"$out/test_distributed.log" 2>&1
  echo "Nccl tests: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_distributed.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$out/test_distributed.log" | head
fi
# Each run times the float and the QAT step (--recipe), so one call per mode.
rows=()
for mode in ${MODES:-1gpu 2gpu 2gpu-nosync}; do
  args=()
  [ "$mode" != 1gpu ] && args=(--nproc 2)
  [ "$mode" = 2gpu-nosync ] && args+=(--no-grad-sync)
  [ "$mode" = 2gpu-bf16 ] && args+=(--grad-reduce-dtype bf16)
  [ "$mode" = 2gpu-bf16-200 ] && args+=(--grad-reduce-dtype bf16 --bucket-mb 200)
  [[ "$mode" == 2gpu-mb* ]] && args+=(--bucket-mb "${mode#2gpu-mb}")
  timeout 240 "$qat" steps --device cuda --model llama --precision bf16-mixed \
    --recipe "${RECIPE:-8da4w}" --reps "${REPS:-20}" "${args[@]}" >"$out/steps_$mode.log" 2>&1
  echo "rc=$? $mode"
  rows+=("$mode: $(grep -E 'step llama' "$out/steps_$mode.log" | tr -s ' ' | tr '\n' ';')")
done
torchao=.gpudeps/torchao
if [ ! -d "$torchao" ] && ls .gpudeps/wheels/torchao-*.whl >/dev/null 2>&1; then
  python3 -m zipfile -e .gpudeps/wheels/torchao-*.whl "$torchao"
fi
if [ -z "${SKIP_TORCH:-}" ]; then
  PYTHONPATH="$build/python:$torchao" timeout 200 python3 bench/torch_llama_ddp_bench.py \
    >"$out/torch_1gpu.log" 2>&1
  PYTHONPATH="$build/python:$torchao" timeout 300 torchrun --nproc_per_node 2 \
    bench/torch_llama_ddp_bench.py >"$out/torch_2gpu.log" 2>&1
fi
echo "==== rows"
printf '%s\n' "${rows[@]}"
cat "$out/torch_1gpu.log" "$out/torch_2gpu.log" 2>/dev/null | grep -E "^\||x [12]," | grep -v "^|---"
