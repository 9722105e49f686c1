#!/usr/bin/env bash
# On the GPU machine: build, then time our cases (`qat bench`) and PyTorch's in one run and
# print the comparison table. Logs and JSON go to $OUT (or ./out).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
jobs=$(nproc)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF > /tmp/qg_configure.log 2>&1
cmake --build build-gpu -j "$jobs" --target qat > /tmp/qg_build.log 2>&1 || { tail -50 /tmp/qg_build.log; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv 
./build-gpu/apps/qat bench --device cuda --reps "${REPS:-100}" --json "$out/ours.json"  \
  ${QUICK:+--quick} ${FILTER:+--filter "$FILTER"} 2>&1 | tee "$out/ours.txt"
[ -n "${SKIP_TORCH:-}" ] && exit 0
python3 bench/torch_bench.py --device cuda --reps "${REPS:-100}" --json "$out/torch.json" ${QUICK:+--quick} \
  ${FILTER:+--filter "$FILTER"} \
  > /tmp/qg_torch.log 2>&1 || tail -20 /tmp/qg_torch.log
python3 bench/compare.py "$out/ours.json" "$out/torch.json" | tee "$out/table.md"
