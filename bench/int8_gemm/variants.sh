#!/usr/bin/env bash
# Times kernel variants side by side: `variants.sh build|run|all NAME=FLAGS ...` builds the
# harness once per variant (FLAGS: space-separated -D options for the kernel, empty for the
# kernel as it is), in parallel, and/or runs each with --timing-only, printing its timing
# table. Binaries and logs go under $VARIANTS_DIR (default out/int8_gemm/variants).
set -uo pipefail
cd "$(dirname "$0")/../.."
mode="$1"
shift
V="${VARIANTS_DIR:-out/int8_gemm/variants}"
mkdir -p "$V"
NV=(nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -I.)
if [[ "$mode" != run ]]; then
  "${NV[@]}" -c bench/int8_gemm/int8_gemm_check.cu -o "$V/check.o" &
  "${NV[@]}" -c core/error.cpp -o "$V/error.o" &
  for arg in "$@"; do
    # shellcheck disable=SC2086
    "${NV[@]}" -Xptxas -v ${arg#*=} -c ops/int8_matmul/int8_gemm_cuda.cu -o "$V/${arg%%=*}.o" \
      >"$V/${arg%%=*}.build.log" 2>&1 &
  done
  wait
  for arg in "$@"; do
    nvcc -arch=sm_90 "$V/check.o" "$V/error.o" "$V/${arg%%=*}.o" -lcublas -o "$V/${arg%%=*}" ||
      cat "$V/${arg%%=*}.build.log"
  done
fi
[[ "$mode" == build ]] && exit 0
for arg in "$@"; do
  name="${arg%%=*}"
  echo "=== $name (${arg#*=})"
  grep -E "registers|spill" "$V/$name.build.log" | sort | uniq -c | sort -rn | head -3
  "$V/$name" --timing-only >"$V/$name.log" 2>&1
  grep -E "FAIL|^ *[0-9]+x|summary|ceiling" "$V/$name.log"
done
