#!/usr/bin/env bash
# On a GPU machine, one call for kernel work (issue 14): build, run GPU test suites and
# `qat crosscheck`, time the benchmark rows (`qat bench`, fused paths only) and PyTorch's
# same rows in the same run, and print the comparison table. $OUT (or ./out) receives
# table.md, ours.json, torch.json and logs.tgz (every log), so at most a few files return.
# Environment: TESTS (test targets, default "test_gpu test_gpu_fused"), FILTER (bench rows,
# `qat bench --filter` syntax; default the issue-14 rows), REPS (100), CROSSCHECK (1; 0
# skips it), SKIP_TORCH (non-empty: ours only), TORCH_ARGS (e.g. --no-compile), STEPS (non-empty: also `qat steps --profile`),
# EXTRA (a command run last, its output logged, e.g. a CPU thread-scaling run).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
logs=$(mktemp -d)
build=${BUILD_DIR:-build-gpu}
tests=${TESTS-test_gpu test_gpu_fused}
filter=${FILTER:-obs+fq per-tensor|obs+fq per-channel|fq fwd per-tensor|fq fwd+bwd per-tensor|dynamic int8 per-token|int4 g128 pack}
export NCCL_NVLS_ENABLE=0
finish() { tar czf "$out/logs.tgz" -C "$logs" . 2>/dev/null; }
trap finish EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader

t0=$(date +%s)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF >"$logs/configure.log" 2>&1 ||
  { tail -30 "$logs/configure.log"; exit 1; }
# shellcheck disable=SC2086
cmake --build "$build" -j "$(nproc)" --target qat $tests >"$logs/build.log" 2>&1 ||
  { grep -E "error" -A4 "$logs/build.log" | head -60; exit 1; }
echo "build: $(($(date +%s) - t0)) s"

for t in $tests; do
  timeout 300 "$build/tests/$t" --gtest_brief=1 >"$logs/$t.log" 2>&1
  echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$logs/$t.log" | head -20
done
if [ "${CROSSCHECK:-1}" != 0 ]; then
  timeout 400 "$build/apps/qat" crosscheck >"$logs/crosscheck.log" 2>&1
  echo "qat crosscheck: rc=$? $(grep -E '^crosscheck summary' "$logs/crosscheck.log")"
  grep -E ' FAIL |MISSING' "$logs/crosscheck.log" | head -30
fi

"$build/apps/qat" bench --device cuda --fused-only --reps "${REPS:-100}" --filter "$filter" \
  --json "$out/ours.json" >"$logs/ours.txt" 2>&1 || tail -20 "$logs/ours.txt"
if [ -z "${SKIP_TORCH:-}" ]; then
  # shellcheck disable=SC2086
  python3 bench/torch_bench.py --device cuda --reps "${REPS:-100}" --filter "$filter" ${TORCH_ARGS:-} \
    --json "$out/torch.json" >"$logs/torch.log" 2>&1 || tail -20 "$logs/torch.log"
  python3 bench/compare.py "$out/ours.json" "$out/torch.json" >"$out/table.md"
else
  cp "$logs/ours.txt" "$out/table.md"
fi
cat "$out/table.md"

if [ -n "${STEPS:-}" ]; then
  timeout 300 "$build/apps/qat" steps --device cuda --model all --profile >"$logs/steps.txt" 2>&1
  echo "qat steps: rc=$?"
  head -150 "$logs/steps.txt"
fi
if [ -n "${EXTRA:-}" ]; then
  bash -c "$EXTRA" >"$logs/extra.log" 2>&1
  echo "extra: rc=$?"
  tail -60 "$logs/extra.log"
fi
