#!/usr/bin/env bash
# On the 2-GPU machine, one call: how the data-parallel Llama step (207M, bf16-mixed, batch
# 8 x 1024 per GPU) overlaps its gradient all-reduce. Builds qat, then
#   1. the 1-GPU float and 8da4w steps (the base of the scaling);
#   2. the 2-GPU float step for each bucket cap in BUCKETS_MB (MiB), and the 8da4w step at the
#      default cap (runtime/distributed/gradient_sync.h: kDefaultBucketBytes);
#   3. the timeline of the all-reduces in steps launched kernel by kernel (QG_CUDA_GRAPH=0,
#      QG_NCCL_TRACE): when each starts and ends, and whether the compute stream ever waits.
# $OUT gets overlap.log (the rows and the timeline's summary) and trace.csv (rank 0's marks).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec > >(tee "$out/overlap.log") 2>&1
export NCCL_NVLS_ENABLE=0
build=${BUILD_DIR:-build-dist}
[ -d .gpudeps/root ] && [ ! -f /usr/include/eigen3/Eigen/Core ] && cp -rn .gpudeps/root/. / 2>/dev/null
t0=$(date +%s)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF -DQG_ENABLE_ONNX=OFF \
  -DQG_ENABLE_SENTENCEPIECE=OFF -DPython3_EXECUTABLE="$(command -v python3)" >/dev/null 2>&1
cmake --build "$build" -j "$(nproc)" --target qat >"$build.log" 2>&1 ||
  { grep error -A4 "$build.log" | head -30; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
qat=$build/apps/qat
steps() {  # label, then arguments of `qat steps` for the 207M Llama step
  local label=$1
  shift
  echo "$label: $(timeout 120 "$qat" steps --device cuda --model llama --precision bf16-mixed \
    --reps 20 "$@" 2>&1 | grep -E 'step llama|rror' | tr -s ' ' | tr '\n' ';')"
}
CUDA_VISIBLE_DEVICES=0 steps 1gpu
for mb in ${BUCKETS_MB:-25 100 400 1000}; do
  steps "2gpu float, $mb MiB buckets" --variant float --nproc 2 --bucket-mb "$mb"
done
steps "2gpu 8da4w, default buckets" --variant qat --nproc 2
QG_CUDA_GRAPH=0 QG_NCCL_TRACE="$out/trace.csv" steps "2gpu float, launched, traced" \
  --variant float --nproc 2 --reps 5
# The timeline of the fourth traced step (the first ones warm up): each all-reduce's issue,
# start and end (ms from the step's first issue), and the longest wait of the compute stream.
python3 - "$out/trace.csv" <<'PY'
import sys
rows = [l.split(",") for l in open(sys.argv[1])]
steps, cur, prev = [], [], None
for kind, count, ms, _ in rows:
    if kind == "i" and prev in ("w", "r"):
        steps.append(cur)
        cur = []
    cur.append((kind, int(count), float(ms)))
    prev = kind
steps.append(cur)
if len(steps) < 5:
    sys.exit(f"trace: {len(steps)} steps, expected at least 5")
step = steps[3]
t0 = step[0][2]
issues = [(c, t) for k, c, t in step if k == "i"]
ends = [t for k, c, t in step if k == "e"]
for (count, t), end in zip(issues, ends):
    print(f"  all-reduce of {count * 4 / 1e6:7.1f} MB issued at {t - t0:6.2f} ms, done at {end - t0:6.2f} ms")
waits = [(step[i][2], step[i + 1][2]) for i in range(len(step) - 1) if step[i][0] == "w"]
longest = max((r - w for w, r in waits), default=0.0)
print(f"  compute stream: {len(waits)} waits for buckets from {waits[0][0] - t0:.2f} ms, "
      f"the longest {longest:.3f} ms; last all-reduce done at {ends[-1] - t0:.2f} ms")
PY
