#!/usr/bin/env bash
# On the 2-GPU machine: build qat and the data-parallel tests (CUDA, NCCL from PyTorch's
# wheel, Gloo when its files are present), run the NCCL tests, then time the QAT training
# step on 1 GPU and on 2 GPUs with the global batch doubled (each rank keeps the per-GPU
# batch), for the CNN and the transformer, with the statistics sync on (through the peer
# mailbox, then through NCCL) and off; and, with Gloo, 2 CPU ranks against 1 with the
# same threads in total. Logs go to $OUT (or ./out); a summary is printed last.
#   scripts/gpu_dist_check.sh
# Gloo's Debian files may be carried in .glooroot (copied under / without replacing files).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
build=${BUILD_DIR:-build-dist}
summary=()
note() { summary+=("$1"); echo "$1"; }
[ -d .glooroot ] && cp -rn .glooroot/. / 2>/dev/null
# The build dependencies the image lacks (scripts/pack_gpu_deps.sh).
if [ -d .gpudeps/root ] && [ ! -f /usr/include/eigen3/Eigen/Core ]; then cp -rn .gpudeps/root/. /; fi
# The digits data: the GPU image's sklearn ships the same CSV.
if [ -z "${QG_DIGITS_CSV:-}" ] && [ ! -f /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz ]; then
  QG_DIGITS_CSV=$(python3 -c "import os, sklearn; print(os.path.join(os.path.dirname(sklearn.__file__), 'datasets', 'data', 'digits.csv.gz'))" 2>/dev/null) && export QG_DIGITS_CSV
fi
note "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' ')"
python=$(command -v python3)
t0=$(date +%s)
configure() {
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF -DQG_ENABLE_ONNX=OFF \
    -DPython3_EXECUTABLE="$python" "$@" >"$out/configure.log" 2>&1
}
configure || { tail -30 "$out/configure.log"; echo "SUMMARY: configure failed"; exit 1; }
if ! cmake --build "$build" -j "$(nproc)" --target qat dist_worker test_distributed >"$out/build.log" 2>&1; then
  note "build with Gloo failed ($(grep -m1 -E 'error' "$out/build.log")); rebuilding without Gloo"
  configure -DQG_ENABLE_GLOO=OFF
  cmake --build "$build" -j "$(nproc)" --target qat dist_worker test_distributed >"$out/build.log" 2>&1 ||
    { grep -E "error" -A3 "$out/build.log" | head -40; echo "SUMMARY: build failed"; exit 1; }
fi
note "$(grep -E 'qatgraph: (CUDA|NCCL|Gloo)' "$out/configure.log" | tr '\n' ' ')"
note "build: $(($(date +%s) - t0)) s"
qat=$build/apps/qat

QG_TEST_GPUS=2 timeout 240 "$build"/tests/test_distributed --gtest_filter="${TEST_FILTER:-*}" >"$out/test_distributed.log" 2>&1
rc=$?
# The failures in full, and the ranks' own errors.
grep -B2 -A12 -E '^\[  FAILED  \] Nccl' "$out/test_distributed.log" | head -60
cat /tmp/qg_dist_nccl*/err_r*.txt 2>/dev/null | head -10
(exit $rc)
note "test_distributed: rc=$?; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/test_distributed.log" | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Za-z]' "$out/test_distributed.log" | head

# Step times: each rank prints its own mean step time.
q=(--act-bits 8 --weight-bits 8)
steps=${STEPS:-200}
IFS=, read -ra specs <<<"${MODELS:-cnn 256,transformer 256}"  # MODELS="cnn 256" times one
for spec in "${specs[@]}"; do
  set -- $spec
  model=$1
  batch=$2
  timeout 120 "$qat" train --model "$model" "${q[@]}" --device cuda --batch "$batch" \
    --time-steps "$steps" >"$out/step_${model}_1gpu.log" 2>&1
  t1=$(grep -oE '[0-9.]+ us' "$out/step_${model}_1gpu.log" | head -1)
  timeout 180 "$qat" train --model "$model" "${q[@]}" --device cuda --batch "$batch" \
    --time-steps "$steps" --nproc 2 >"$out/step_${model}_2gpu.log" 2>&1
  t2=$(grep -oE '[0-9.]+ us' "$out/step_${model}_2gpu.log" | tr '\n' ' ')
  QG_PEER_MAILBOX=0 timeout 180 "$qat" train --model "$model" "${q[@]}" --device cuda --batch "$batch" \
    --time-steps "$steps" --nproc 2 >"$out/step_${model}_2gpu_nccl.log" 2>&1
  t5=$(grep -oE '[0-9.]+ us' "$out/step_${model}_2gpu_nccl.log" | tr '\n' ' ')
  timeout 180 "$qat" train --model "$model" "${q[@]}" --device cuda --batch "$batch" \
    --time-steps "$steps" --nproc 2 --no-sync-observers --no-sync-bn >"$out/step_${model}_2gpu_nosync.log" 2>&1
  t3=$(grep -oE '[0-9.]+ us' "$out/step_${model}_2gpu_nosync.log" | tr '\n' ' ')
  timeout 180 "$qat" train --model "$model" "${q[@]}" --device cuda --batch "$batch" \
    --time-steps "$steps" --nproc 2 --zero1 >"$out/step_${model}_2gpu_zero1.log" 2>&1
  t4=$(grep -oE '[0-9.]+ us' "$out/step_${model}_2gpu_zero1.log" | tr '\n' ' ')
  note "$model W8A8 QAT step, batch $batch per GPU: 1 GPU $t1; 2 GPUs (global batch $((2 * batch))) statistics sync on $t2; on through NCCL (QG_PEER_MAILBOX=0) $t5; off $t3; sync on + --zero1 $t4"
  note "  $(grep -m1 -oE 'observer statistics through .*' "$out/step_${model}_2gpu.log")"
  note "  optimizer state per rank: $(grep -ohE 'optimizer state [0-9]+ bytes' "$out/step_${model}_2gpu.log" | head -1 | tr -dc '0-9') bytes; --zero1: $(grep -ohE 'optimizer state [0-9]+ bytes' "$out/step_${model}_2gpu_zero1.log" | tr -dc '0-9 ' | tr -s ' ')"
  grep -m1 -i "error" "$out/step_${model}_2gpu.log"
  if [ -z "${SKIP_TORCH:-}" ]; then
    timeout 120 python3 scripts/torch_ddp_qat_bench.py --model "$model" --batch "$batch" --world 1 \
      --steps "$steps" >"$out/torch_${model}_1gpu.log" 2>&1
    timeout 180 python3 scripts/torch_ddp_qat_bench.py --model "$model" --batch "$batch" --world 2 \
      --steps "$steps" >"$out/torch_${model}_2gpu.log" 2>&1
    note "  torch prepare_qat: 1 GPU $(grep -oE '[0-9.]+ us' "$out/torch_${model}_1gpu.log" | head -1); DDP 2 GPUs $(grep -oE '[0-9.]+ us' "$out/torch_${model}_2gpu.log" | tr '\n' ' ') $(grep -m1 -E 'Error' "$out/torch_${model}_2gpu.log")"
  fi
done

if grep -q "qatgraph: Gloo ON" "$out/configure.log"; then
  cores=$(nproc)
  half=$((cores / 2))
  timeout 120 "$qat" --threads "$cores" train --model cnn "${q[@]}" --device cpu --batch 128 \
    --time-steps 30 >"$out/cpu_cnn_1rank.log" 2>&1
  timeout 180 "$qat" --threads "$half" train --model cnn "${q[@]}" --device cpu --batch 64 \
    --time-steps 30 --nproc 2 >"$out/cpu_cnn_2ranks.log" 2>&1
  timeout 180 "$qat" --threads "$half" train --model cnn "${q[@]}" --device cpu --batch 64 \
    --time-steps 30 --nproc 2 --no-sync-observers >"$out/cpu_cnn_2ranks_nosync.log" 2>&1
  note "CPU CNN W8A8, global batch 128: 1 rank x $cores threads $(grep -oE '[0-9.]+ us' "$out/cpu_cnn_1rank.log" | head -1); 2 ranks x $half threads $(grep -oE '[0-9.]+ us' "$out/cpu_cnn_2ranks.log" | tr '\n' ' '); observer sync off $(grep -oE '[0-9.]+ us' "$out/cpu_cnn_2ranks_nosync.log" | tr '\n' ' ')"
fi
echo "==== SUMMARY ===="
printf '%s\n' "${summary[@]}"
