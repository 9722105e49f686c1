#!/usr/bin/env bash
# Nsight Compute on the language-model step's hot spots, one GPU call: why a kernel sits at
# several times its floor (`qat steps --floors`). Builds qat, then profiles one step of the
# 207M Llama (bf16-mixed, RECIPE, default 8da4w) launched kernel by kernel (QG_CUDA_GRAPH=0:
# ncu sees each launch, not one graph), for the kernels whose names match KERNELS (an ncu
# regex; default: rms_norm's, rope's, cross-entropy's and dynamic_fake_quantize's), COUNT
# launches (default 12) after SKIP (default 0). Writes $OUT/ncu.csv (raw metrics of the
# SpeedOfLight, Occupancy, LaunchStats and MemoryWorkloadAnalysis sections) and prints, per
# kernel, duration, achieved DRAM bandwidth, SM throughput and occupancy. Carry .gpudeps.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ -d .gpudeps/root ] && [ ! -f /usr/include/eigen3/Eigen/Core ] && cp -rn .gpudeps/root/. / 2>/dev/null
build=build-gpu
t0=$(date +%s)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF -DQG_ENABLE_ONNX=OFF \
  -DQG_ENABLE_SENTENCEPIECE=OFF >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target qat >"$out/build.log" 2>&1 ||
  { grep -E "error" -A4 "$out/build.log" | head -40; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
kernels=${KERNELS:-regex:"(dx_kernel|dweight_partial|forward_kernel|rope_kernel|ce_rows|ce_backward|team_kernel)"}
QG_CUDA_GRAPH=0 CUDA_VISIBLE_DEVICES=0 timeout 500 ncu --csv --page raw \
  -k "$kernels" --launch-skip "${SKIP:-0}" --launch-count "${COUNT:-12}" \
  --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section MemoryWorkloadAnalysis \
  "$build/apps/qat" steps --device cuda --model llama --precision bf16-mixed \
  --recipe "${RECIPE:-8da4w}" --reps 1 >"$out/ncu.csv" 2>"$out/ncu.err"
echo "ncu: rc=$? ($(grep -c '^"' "$out/ncu.csv") lines)"
python3 - "$out/ncu.csv" <<'EOF'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if head is None:
    sys.exit("no kernel rows (see ncu.err)")
names = rows[head]
col = {n: names.index(n) for n in names}
want = {"time": "gpu__time_duration.sum",
        "DRAM % peak": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "SM % peak": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "occupancy %": "sm__warps_active.avg.pct_of_peak_sustained_active",
        "grid": "launch__grid_size"}
print("kernel | " + " | ".join(want))
want = list(want.values())
for r in rows[head + 2:]:
    name = r[col["Kernel Name"]][:60]
    print(name + " | " + " | ".join(r[col[w]] if w in col else "-" for w in want))
EOF
