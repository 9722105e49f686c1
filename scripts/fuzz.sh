#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (build-fuzz/) and runs each one over its
# seed corpus in fuzz/corpus/<target>/.
#   scripts/fuzz.sh [seconds]     each target for `seconds` (default 60)
#   scripts/fuzz.sh --runs N      each target for N inputs (scripts/test.sh: a short smoke run)
# New interesting inputs go to build-fuzz/corpus/<target>/, not into the committed seeds. A
# crash stops the script with the failing input saved as build-fuzz/crash-<target>-*; fix the
# reader, then keep the input as fuzz/corpus/<target>/crash-<what>.bin.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=(-max_total_time="${1:-60}")
if [ "${1:-}" = "--runs" ]; then
  limit=(-runs="${2:?--runs needs a count}")
fi
cxx=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$cxx" ]; then
  echo "fuzz.sh: clang++ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 1
fi
dir=build-fuzz
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S fuzz -B "$dir" -DCMAKE_CXX_COMPILER="$cxx" > "$dir.configure.log" 2>&1 || {
    cat "$dir.configure.log"; exit 1; }
fi
cmake --build "$dir" -j "$(nproc 2>/dev/null || echo 2)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for target in npy npz safetensors checkpoint digits; do
  mkdir -p "$dir/corpus/$target"
  echo "fuzz.sh: $target (${limit[*]})"
  # Inputs up to 64 KiB; one allocation over 512 MiB is a failure (a reader that trusts a
  # size from the file and allocates it), not a slow run.
  log="$dir/fuzz_$target.log"
  rc=0
  "$dir/fuzz_$target" "${limit[@]}" -max_len=65536 -rss_limit_mb=2048 -malloc_limit_mb=512 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$dir/crash-$target-" \
    "$dir/corpus/$target" "fuzz/corpus/$target" > "$log" 2>&1 || rc=$?
  grep -E "^Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb" "$log" || true
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz.sh: $target FAILED (exit $rc; the input is in $dir/crash-$target-*)" >&2
    exit 1
  fi
done
echo "fuzz.sh: all targets clean"
