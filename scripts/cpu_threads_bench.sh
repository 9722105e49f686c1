#!/usr/bin/env bash
# CPU thread scaling (issue 14 part 3) in one run, written as markdown to OUT.md:
#   scripts/cpu_threads_bench.sh OUT.md
# Times [8192, 4096] f32 fake-quant forward, fused observer + fake-quant and fake-quant
# forward + backward with 1, 2, 4, 8 and 16 threads (`qat --threads n bench`), PyTorch's same
# ops with torch.set_num_threads(n) (bench/torch_cpu_threads.py, whatever `python3` has
# torch), and `qat train --compare --device cpu` with 1 thread and with every CPU, checking
# that the accuracies are identical. Each of our rows also has, from the same `qat bench` run
# and thread count, thread-pool copies (in the kernels' chunks) of x's bytes and of the bytes
# the case's kernels read + write, so the table gives ours / copy and GB/s per thread count.
# Builds nothing: run scripts/build.sh first.
# Environment: THREADS (default 1,2,4,8,16), REPS (10), MODELS (mlp cnn transformer; empty
# to skip training), SKIP_OPS (non-empty: training only), PYTHON (python3), QAT
# (build/apps/qat).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: scripts/cpu_threads_bench.sh OUT.md" >&2; exit 2; }
out_md=$1
qat=${QAT:-build/apps/qat}
[ -x "$qat" ] || { echo "$qat not found: run scripts/build.sh build first" >&2; exit 1; }
threads=${THREADS:-1,2,4,8,16}
reps=${REPS:-10}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

filter='obs+fq per-tensor f32|fq fwd per-tensor f32|fq fwd+bwd per-tensor f32'
if [ -z "${SKIP_OPS:-}" ]; then
  for n in ${threads//,/ }; do
    "$qat" --threads "$n" bench --device cpu --shape 8192,4096 --fused-only --reps "$reps" \
      --filter "$filter" --json "$work/ours_$n.json" | tail -n +2 | sed "s/^/threads $n: /"
  done
  "${PYTHON:-python3}" bench/torch_cpu_threads.py --threads "$threads" --reps "$reps" \
    --json "$work/torch.json" || echo "PyTorch side failed: the table has our columns only"
fi

all=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
for model in ${MODELS-mlp cnn transformer}; do
  for n in 1 "$all"; do
    start=$(date +%s.%N)
    "$qat" --threads "$n" train --compare --device cpu --model "$model" --out "$work/out" \
      > "$work/train_${model}_$n.txt"
    python3 -c "print($(date +%s.%N) - $start)" > "$work/train_${model}_$n.seconds"
    echo "train --compare --model $model, $n threads: $(cat "$work/train_${model}_$n.seconds") s"
  done
done
python3 bench/threads_table.py "$work" "$out_md" > /dev/null
echo "wrote $out_md"
