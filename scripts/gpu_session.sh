#!/usr/bin/env bash
# One call on the 2-GPU machine (nvidia-h200-x2 / nvidia-h100-x2) that checks and measures what
# a session changed, with one build: every target; the NCCL tests on both GPUs; the 207M Llama
# step on one GPU and data-parallel on two (f32 and bf16 gradient buckets, and without the
# all-reduce: scripts/gpu_dist_llama.sh); every LLM recipe beside the float step; the per-op
# floor table of the 8da4w step; the profile of qatgraph.torch in transformers' Llama; then the
# whole ctest suite on GPU 0 with the time that is left (DEADLINE_S after the start, 560 by
# default, under the 600 s a call may run). On a 1-GPU machine the 2-GPU parts report a skip.
# Carry .gpudeps (scripts/pack_gpu_deps.sh). The lent host returns at most 8 files: $OUT gets
# session.log (the summary printed here too), ctest.log, floors_8da4w.log, floors_float.log,
# torch_profile.txt, torch_steps.txt, dist.log; the rest stays in a scratch folder on the host.
# PEAK_GBPS: the memory bandwidth the floors are set against (default: 4800 on H200s, 3350 on
# H100s).
set -uo pipefail
cd "$(dirname "$0")/.."
deadline=$(($(date +%s) + ${DEADLINE_S:-560}))
out=${OUT:-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
scratch=$(mktemp -d)
exec > >(tee "$out/session.log") 2>&1
export NCCL_NVLS_ENABLE=0
[ -d .gpudeps/root ] && [ ! -f /usr/include/eigen3/Eigen/Core ] && cp -rn .gpudeps/root/. / 2>/dev/null
if [ -z "${QG_DIGITS_CSV:-}" ] && [ ! -f /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz ]; then
  QG_DIGITS_CSV=$(python3 -c "import os, sklearn; print(os.path.join(os.path.dirname(sklearn.__file__), 'datasets', 'data', 'digits.csv.gz'))" 2>/dev/null) && export QG_DIGITS_CSV
fi
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
peak_gbps=${PEAK_GBPS:-4800}
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && peak_gbps=${PEAK_GBPS:-3350}
echo "gpus: $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' ')"
build=build-gpu
py=$(command -v python3)
t0=$(date +%s)
# SentencePiece off: loading it in a CUDA build aborts on the lent image (gpu_sentencepiece.sh).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF -DQG_ENABLE_ONNX=OFF \
  -DQG_ENABLE_SENTENCEPIECE=OFF -DPython3_EXECUTABLE="$py" -DPython_EXECUTABLE="$py" \
  >"$scratch/configure.log" 2>&1 || { tail -20 "$scratch/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" >"$scratch/build.log" 2>&1 ||
  { grep -E "error" -A4 "$scratch/build.log" | head -40; exit 1; }
echo "build: $(($(date +%s) - t0)) s; $(grep -E 'qatgraph: (cuDNN frontend|NCCL)' "$scratch/configure.log" | tr '\n' ' ')"
qat=$build/apps/qat

if [ "$gpus" -ge 2 ]; then
  echo "==== data parallel (scripts/gpu_dist_llama.sh, NCCL tests first)"
  OUT=$scratch RUN_TESTS=1 BUILD_DIR=$build SKIP_TORCH=${SKIP_TORCH:-1} \
    MODES="1gpu 2gpu 2gpu-bf16 2gpu-nosync" bash scripts/gpu_dist_llama.sh >"$out/dist.log" 2>&1
  grep -E "^Nccl tests|^\[  FAILED  \] [A-Z]|^1gpu|^2gpu|\| torch" "$out/dist.log"
else
  echo "==== data parallel: skipped (one GPU)"
fi

echo "==== one GPU: every recipe beside the float step"
for recipe in 8da4w int4_weight_only w8a8_dynamic; do
  CUDA_VISIBLE_DEVICES=0 timeout 60 "$qat" steps --device cuda --model llama --precision bf16-mixed \
    --recipe "$recipe" --reps 20 2>&1 | grep "step llama" | tr -s ' '
done
# The same steps without merge_duplicate_nodes: the graph before it (three casts of the q/k/v
# input and two of gate/up, and no dfq+cast fusion of those), so its saving shows in one call.
for recipe in 8da4w; do
  CUDA_VISIBLE_DEVICES=0 QG_DISABLE_PASSES=merge_duplicate_nodes timeout 60 "$qat" steps \
    --device cuda --model llama --precision bf16-mixed --recipe "$recipe" --reps 20 2>&1 |
    grep "step llama" | tr -s ' ' | sed 's/^/(no merge) /'
done
CUDA_VISIBLE_DEVICES=0 timeout 60 "$qat" steps --device cuda --model llama --precision bf16-mixed \
  --recipe 8da4w --variant qat --optimizer adamw --reps 20 --profile --floors \
  --peak-gbps "$peak_gbps" >"$out/floors_8da4w.log" 2>&1
echo "floors: rc=$? (floors_8da4w.log)"
# The float step's, beside it: which ops the QAT step adds time to.
CUDA_VISIBLE_DEVICES=0 timeout 60 "$qat" steps --device cuda --model llama --precision bf16-mixed \
  --variant float --optimizer adamw --reps 20 --profile --floors \
  --peak-gbps "$peak_gbps" >"$out/floors_float.log" 2>&1
echo "floors float: rc=$? (floors_float.log)"

torchao=.gpudeps/torchao
if [ ! -d "$torchao" ] && ls .gpudeps/wheels/torchao-*.whl >/dev/null 2>&1; then
  python3 -m zipfile -e .gpudeps/wheels/torchao-*.whl "$torchao"
fi
CUDA_VISIBLE_DEVICES=0 PYTHONPATH="$build/python:$torchao" timeout 90 python3 \
  bench/torch_llama_qat_bench.py --profile >"$out/torch_profile.txt" 2>&1
echo "qatgraph.torch profile: rc=$?; $(grep 'GPU kernel time per step' "$out/torch_profile.txt")"

# qatgraph.torch's 8da4w against the float step in transformers' Llama: launched step by
# step (with torchao's 8da4w QAT beside them), then each step replayed as one CUDA graph (no
# host work per step). Then the CNN QAT step against torch.ao's prepare_qat, both ways.
for mode in "" --cuda-graph; do
  skip=""
  [ -n "$mode" ] && skip=--skip-torchao
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH="$build/python:$torchao" timeout 150 python3 \
    bench/torch_llama_qat_bench.py $skip $mode >>"$out/torch_steps.txt" 2>&1
  echo "qatgraph.torch Llama steps ${mode:-eager}: rc=$?"
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH="$build/python" timeout 60 python3 \
    bench/torch_prepare_step_bench.py $mode >>"$out/torch_steps.txt" 2>&1
  echo "qatgraph.torch CNN steps ${mode:-eager}: rc=$?"
done
grep -E "^\| (float|qatgraph|torch)|failed|captured" "$out/torch_steps.txt"

left=$((deadline - $(date +%s)))
echo "==== ctest on GPU 0 ($left s left; NCCL tests ran above)"
# Not here: the tests that run /usr/bin/python3 with numpy (the conformance scripts, op_serve),
# which the GPU image's system Python lacks; they need no GPU and CI runs them.
if [ "$left" -gt 30 ]; then
  (cd "$build" && CUDA_VISIBLE_DEVICES=0 timeout "$left" ctest -j "$(nproc)" --timeout 200 \
    -E "fuzz|conformance|op_serve|package_consumer|torch_import|Nccl" >"$out/ctest.log" 2>&1)
  echo "ctest: rc=$?; $(grep -E 'tests passed|tests failed' "$out/ctest.log")"
  grep -E "\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)\)" "$out/ctest.log" | head -20
fi
