#!/usr/bin/env bash
# On a GPU machine, the issue-12 checks in one call: build once, run the GPU cases of the
# model-op test suites (conv, norm, pool, activation, dropout, softmax, embedding, shape,
# linalg, nn), `qat crosscheck` over every op, compute-sanitizer memcheck on the model ops,
# then the whole-step timings against PyTorch (`qat steps`, bench/torch_model_steps.py, with
# conv2d through cuDNN and through im2col + cuBLAS). Logs go to $OUT (or ./out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
build=${BUILD_DIR:-build-gpu}
export NCCL_NVLS_ENABLE=0
# The nn tests train on the digits data: scikit-learn's copy where Debian's is absent.
if [ -z "${QG_DIGITS_CSV:-}" ] && [ ! -f /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz ]; then
  QG_DIGITS_CSV=$(python3 -c "import os, sklearn; print(os.path.join(os.path.dirname(sklearn.__file__), 'datasets', 'data', 'digits.csv.gz'))" 2>/dev/null) && export QG_DIGITS_CSV
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1

# SUITES="ops_norm ops_linalg" narrows the test suites (default: every model-op suite);
# MEMCHECK=0 skips compute-sanitizer.
suites=()
for d in ${SUITES:-ops_conv ops_norm ops_pool ops_activation ops_dropout ops_softmax ops_embedding \
  ops_shape ops_linalg nn gpu}; do
  [ -d "tests/$d" ] && suites+=("test_$d")
done
t0=$(date +%s)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
grep -E "qatgraph:" "$out/configure.log"
cmake --build "$build" -j "$(nproc)" --target qat "${suites[@]}" >"$out/build.log" 2>&1 ||
  { grep -E "error" -A4 "$out/build.log" | head -60; exit 1; }
echo "build: $(($(date +%s) - t0)) s"

echo "==== GPU cases of the model-op suites"
for s in "${suites[@]}"; do
  timeout 300 "$build/tests/$s" --gtest_brief=1 >"$out/$s.log" 2>&1
  echo "$s: rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$s.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$out/$s.log" | head -10
done
if [ -d tests/ops_conv ]; then  # conv2d's other CUDA path (cuDNN is the default when built in)
  QG_CONV_BACKEND=im2col timeout 300 "$build/tests/test_ops_conv" --gtest_brief=1 >"$out/conv_im2col.log" 2>&1
  echo "test_ops_conv (QG_CONV_BACKEND=im2col): rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/conv_im2col.log" | tr '\n' ' ')"
fi

echo "==== qat crosscheck (every op on CPU and GPU)"
timeout 400 "$build/apps/qat" crosscheck >"$out/crosscheck.log" 2>&1
echo "rc=$?"
grep -E ' FAIL |MISSING' "$out/crosscheck.log" | head -30
grep -E '^crosscheck summary|^ops without CUDA' "$out/crosscheck.log"

echo "==== compute-sanitizer memcheck (model-op suites)"
for s in "${suites[@]}"; do
  [ "${MEMCHECK:-1}" = 0 ] && break
  [ "$s" = test_gpu ] && continue
  [ "$s" = test_nn ] && continue  # CPU-only tests: the sanitizer finds no CUDA call to watch
  timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 \
    "$build/tests/$s" --gtest_brief=1 >"$out/memcheck_$s.log" 2>&1
  echo "$s: rc=$? $(grep -E 'ERROR SUMMARY' "$out/memcheck_$s.log" | tail -1)"
done

echo "==== whole training steps"
"$build/apps/qat" steps --device cuda --tf32 --reps "${REPS:-20}" --json "$out/steps_cudnn.json" ${PROFILE:+--profile} 2>&1 | tail -60
QG_CONV_BACKEND=im2col "$build/apps/qat" steps --device cuda --model cnn --reps "${REPS:-20}" \
  --json "$out/steps_im2col.json" 2>&1 | tail -3
python3 bench/torch_model_steps.py --reps "${REPS:-20}" --tf32 --json "$out/steps_torch.json" \
  >"$out/torch_steps.log" 2>&1 || tail -20 "$out/torch_steps.log"
cat "$out/torch_steps.log"
python3 bench/compare_steps.py "$out/steps_cudnn.json" "$out/steps_torch.json" | tee "$out/steps.md"
