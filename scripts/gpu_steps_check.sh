#!/usr/bin/env bash
# On a GPU machine: the compiled-step checks of the one engine path. Builds qat and the
# compile tests, runs them, then times each digits model's training step twice, through
# `qat steps` (the compiled step, median of CUDA-event-timed replays) and through `qat train
# --time-steps` (nn::Trainer, mean wall time), so the two can be compared. BASE_QAT names
# another build's qat (an earlier commit) whose `qat train --time-steps` is printed beside
# them. SKIP_BUILD=1 uses the build directory as it is. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
build=${BUILD_DIR:-build-gpu}
if [ -d .gpudeps/root ] && [ ! -f /usr/include/eigen3/Eigen/Core ]; then
  cp -rn .gpudeps/root/. /
fi
# The digits data: the GPU image's sklearn ships the same CSV.
if [ -z "${QG_DIGITS_CSV:-}" ] && [ ! -f /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz ]; then
  QG_DIGITS_CSV=$(python3 -c "import os, sklearn; print(os.path.join(os.path.dirname(sklearn.__file__), 'datasets', 'data', 'digits.csv.gz'))" 2>/dev/null) && export QG_DIGITS_CSV
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
[ -n "${SKIP_BUILD:-}" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
[ -n "${SKIP_BUILD:-}" ] || cmake --build "$build" -j "$(nproc)" --target qat test_compile ${EXTRA_TARGETS:-} >"$out/build.log" 2>&1 ||
  { grep -E "error" -A4 "$out/build.log" | head -60; exit 1; }
echo "==== compile tests"
"$build"/tests/test_compile --gtest_brief=1 2>&1 | tail -12
echo "==== steps: qat steps (median of replays) vs qat train --time-steps (mean wall time)"
reps=${REPS:-200}
for model in mlp cnn transformer; do
  for bits in 32 8; do
    qat=$([ "$bits" = 8 ] && echo qat || echo float)
    # Row: step digits-<model> <float|qat> fp32 <kernels> <ms> nn::Trainer <ms> ms
    row=$("$build"/apps/qat steps --device cuda --model "digits-$model" --reps "$reps" |
      grep "$qat fp32")
    steps_ms=$(echo "$row" | awk '{print $6}')
    same_process_ms=$(echo "$row" | awk '{print $8}')
    wall_ms=$("$build"/apps/qat steps --device cuda --model "digits-$model" --reps "$reps" --wall |
      grep "$qat fp32" | awk '{print $6}')
    train_us=$("$build"/apps/qat train --device cuda --model "$model" --weight-bits "$bits" \
      --act-bits "$bits" --time-steps "$reps" --out "$out/ts" 2>&1 | grep -oE '[0-9.]+ us' | head -1)
    base_us=""
    [ -n "${BASE_QAT:-}" ] && base_us=$("$BASE_QAT" train --device cuda --model "$model" \
      --weight-bits "$bits" --act-bits "$bits" --time-steps "$reps" --out "$out/ts" 2>&1 |
      grep -oE '[0-9.]+ us' | head -1)
    echo "digits-$model $qat: qat steps ${steps_ms} ms (--wall ${wall_ms} ms; its nn::Trainer ${same_process_ms} ms), qat train --time-steps ${train_us}${base_us:+, base qat train ${base_us}}"
  done
done
