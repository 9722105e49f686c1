#!/usr/bin/env bash
# CPU comparison in one run: our cases (`qat --threads 1 bench --device cpu`) against
# Debian's PyTorch 1.13 with one thread, then the joined table. Thread scaling (1 to 16
# threads on both sides) is scripts/cpu_threads_bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
scripts/build.sh build > /dev/null
./build/apps/qat --threads 1 bench --device cpu --reps "${REPS:-20}" --json "$out/cpu_ours.json" | tee "$out/cpu_ours.txt"
/usr/bin/python3 bench/torch_bench.py --device cpu --reps "${REPS:-20}" --json "$out/cpu_torch.json"
python3 bench/compare.py "$out/cpu_ours.json" "$out/cpu_torch.json" | tee "$out/cpu_table.md"
