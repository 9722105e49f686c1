#!/usr/bin/env bash
# One GPU call that checks a kernel change and measures what it does to the language-model
# step, with a build of only what it runs (216 s on a 16-core one-H200 host, where
# gpu_session.sh's full build takes 191-204 s on the 32-core 2-GPU host):
#   1. the GoogleTest binaries in TESTS (default: test_ops_dynamic_fake_quantize test_gpu_fused)
#      with the filter FILTER (default: all), verbose, on GPU 0;
#   2. the 207M Llama step, bf16-mixed, for each recipe in RECIPES: the float step and the QAT
#      step in one process (so every ratio is taken on one machine, in one call);
#   3. the 8da4w step's per-op floor table (floors_8da4w.log); with INTEGER=1 also each of
#      RECIPES (but int4_weight_only) with --integer-forward (steps.log) and the 8da4w
#      integer-forward step's floor table (floors_8da4w_integer.log);
#   4. with TORCH=1, qatgraph.torch's 8da4w in transformers' Llama against its float step,
#      eager and as one CUDA graph (bench/torch_llama_qat_bench.py, torch_steps.txt).
# Options: CROSSCHECK="op1 op2" runs `qat crosscheck --op` for each (crosscheck.log);
# BASELINE_PASSES=p1,p2 also times every recipe's steps with those passes switched off
# (QG_DISABLE_PASSES), so a pass's effect is measured in the same call; FLOAT_FLOORS=1 writes
# the float step's per-op floor table (floors_float.log); COMPILE=1 times torch.compile of
# transformers' Llama float step beside its eager step (torch_compile.txt; COMPILE_MODES=--compile
# skips the eager one).
# Carry .gpudeps. Logs under $OUT (tests.log, steps.log, floors_8da4w.log, torch_steps.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export NCCL_NVLS_ENABLE=0
[ -d .gpudeps/root ] && [ ! -f /usr/include/eigen3/Eigen/Core ] && cp -rn .gpudeps/root/. / 2>/dev/null
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
peak_gbps=4800
case "$gpu" in *H100*) peak_gbps=3350 ;; esac
echo "gpu: $gpu"
build=build-gpu
py=$(command -v python3)
tests=(${TESTS:-test_ops_dynamic_fake_quantize test_gpu_fused})
targets=(qat "${tests[@]}")
[ -n "${TORCH:-}" ] && targets+=(_core)
t0=$(date +%s)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF -DQG_ENABLE_ONNX=OFF \
  -DQG_ENABLE_SENTENCEPIECE=OFF -DPython3_EXECUTABLE="$py" -DPython_EXECUTABLE="$py" \
  >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$out/build.log" 2>&1 ||
  { grep -E "error" -A4 "$out/build.log" | head -40; exit 1; }
echo "build: $(($(date +%s) - t0)) s (${targets[*]})"

for t in "${tests[@]}"; do
  CUDA_VISIBLE_DEVICES=0 timeout 300 "$build/tests/$t" --gtest_filter="${FILTER:-*}" \
    >>"$out/tests.log" 2>&1
  echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/tests.log" | tail -2 | tr '\n' ' ')"
done
grep -E "^\[  FAILED  \] [A-Z]" "$out/tests.log" | sort -u | head -20

qat=$build/apps/qat
for op in ${CROSSCHECK:-}; do
  CUDA_VISIBLE_DEVICES=0 timeout 120 "$qat" crosscheck --op "$op" >>"$out/crosscheck.log" 2>&1
  echo "crosscheck $op: rc=$? $(tail -1 "$out/crosscheck.log")"
done
# Each run times the float step and the recipe's QAT step, in that order, in one process.
for recipe in ${RECIPES:-8da4w int4_weight_only w8a8_dynamic}; do
  CUDA_VISIBLE_DEVICES=0 timeout 60 "$qat" steps --device cuda --model llama \
    --precision bf16-mixed --recipe "$recipe" --reps 20 2>&1 | grep "step llama" | tr -s ' ' |
    tee -a "$out/steps.log"
  if [ -n "${BASELINE_PASSES:-}" ]; then
    CUDA_VISIBLE_DEVICES=0 QG_DISABLE_PASSES="$BASELINE_PASSES" timeout 60 "$qat" steps \
      --device cuda --model llama --precision bf16-mixed --recipe "$recipe" --reps 20 2>&1 |
      grep "step llama" | tr -s ' ' | sed "s/^/without $BASELINE_PASSES: /" |
      tee -a "$out/steps.log"
  fi
done
if [ -n "${FLOAT_FLOORS:-}" ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 60 "$qat" steps --device cuda --model llama \
    --precision bf16-mixed --variant float --reps 20 --profile --floors \
    --peak-gbps "$peak_gbps" >"$out/floors_float.log" 2>&1
  echo "float floors: rc=$?"
fi
CUDA_VISIBLE_DEVICES=0 timeout 60 "$qat" steps --device cuda --model llama --precision bf16-mixed \
  --recipe 8da4w --variant qat --optimizer adamw --reps 20 --profile --floors \
  --peak-gbps "$peak_gbps" >"$out/floors_8da4w.log" 2>&1
echo "floors: rc=$?; $(grep -E '^    dynamic_fake_quantize ' "$out/floors_8da4w.log" | tail -1)"
if [ -n "${INTEGER:-}" ]; then
  for recipe in ${RECIPES:-8da4w int4_weight_only w8a8_dynamic}; do
    [ "$recipe" = int4_weight_only ] && continue
    CUDA_VISIBLE_DEVICES=0 timeout 60 "$qat" steps --device cuda --model llama \
      --precision bf16-mixed --recipe "$recipe" --integer-forward --variant qat --reps 20 2>&1 |
      grep "step llama" | tr -s ' ' | sed "s/^/integer-forward $recipe: /" | tee -a "$out/steps.log"
  done
  CUDA_VISIBLE_DEVICES=0 timeout 60 "$qat" steps --device cuda --model llama \
    --precision bf16-mixed --recipe 8da4w --integer-forward --variant qat --optimizer adamw \
    --reps 20 --profile --floors --peak-gbps "$peak_gbps" >"$out/floors_8da4w_integer.log" 2>&1
  echo "integer floors: rc=$?"
  grep -E "^    (int8_matmul_ste|quantize|matmul) " "$out/floors_8da4w_integer.log" | tail -3
fi

if [ -n "${TORCH:-}" ]; then
  torchao=.gpudeps/torchao
  if [ ! -d "$torchao" ] && ls .gpudeps/wheels/torchao-*.whl >/dev/null 2>&1; then
    python3 -m zipfile -e .gpudeps/wheels/torchao-*.whl "$torchao"
  fi
  for mode in "" --cuda-graph; do
    CUDA_VISIBLE_DEVICES=0 PYTHONPATH="$build/python:$torchao" timeout 120 python3 \
      bench/torch_llama_qat_bench.py --skip-torchao $mode >>"$out/torch_steps.txt" 2>&1
    echo "qatgraph.torch steps ${mode:-eager}: rc=$?"
  done
  grep -E "^\| (float|qatgraph)|failed" "$out/torch_steps.txt"
fi
if [ -n "${COMPILE:-}" ]; then
  for mode in ${COMPILE_MODES:-eager --compile}; do
    [ "$mode" = eager ] && mode=""
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 bench/torch_llama_qat_bench.py --float-only \
      $mode >>"$out/torch_compile.txt" 2>&1
    echo "torch float step ${mode:-eager}: rc=$?"
  done
  grep -E "^\| float|failed|Error" "$out/torch_compile.txt"
fi
