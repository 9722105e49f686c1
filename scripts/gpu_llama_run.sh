#!/usr/bin/env bash
# On a GPU machine, one call: builds qat, times the 207M Llama step of every QAT recipe beside
# the bf16 float step (`qat steps`, with the device memory each holds), then trains the ~100M
# decoder of examples/llama_100m_config.json on the Python documentation, float and 8da4w QAT
# from the same initialisation, and prints their validation perplexity. Make the tokenizer and
# the token cache on the CPU machine and carry them (DATA, default out/llama100m-data): loading
# SentencePiece in a CUDA build aborts on the lent image (scripts/gpu_sentencepiece.sh). Logs
# go to $OUT. COMPARE=1 runs `qat train --model llama --compare` instead (the PTQ/QAT perplexity
# table; STEPS float steps, QAT_STEPS fine-tune steps, SEEDS seeds); PRECISION (default
# bf16-mixed) applies to every training run. TARGETS adds build targets, PRE runs a command
# (the GPU tests) after the build. FLOORS=1 prints the per-op floor tables instead (below).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
build=${BUILD_DIR:-build-gpu}
data=${DATA:-out/llama100m-data}
steps=${STEPS:-400}
# Missing build dependencies and the corpus (.gpudeps/root, scripts/pack_gpu_deps.sh); -n
# adds what is missing and replaces nothing.
[ -d .gpudeps/root ] && cp -rn .gpudeps/root/. /
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
t0=$(date +%s)
source scripts/gpu_sentencepiece.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF -DQG_ENABLE_ONNX=OFF "${QG_SPM_CMAKE_ARGS[@]}" >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target qat ${TARGETS:-} >"$out/build.log" 2>&1 ||
  { grep -E "error" -A4 "$out/build.log" | head -60; exit 1; }
echo "build: $(($(date +%s) - t0)) s; $(grep -E 'qatgraph: SentencePiece' "$out/configure.log")"
[ -z "${PRE:-}" ] || (eval "$PRE")
echo "==== llama 207M steps, bf16-mixed, each recipe beside the float step"
[ -n "${SKIP_STEPS:-}" ] || for recipe in ${RECIPES:-8da4w int4_weight_only w8a8_dynamic}; do
  timeout 120 "$build"/apps/qat steps --device cuda --model llama --precision bf16-mixed \
    --recipe "$recipe" --reps 20 2>&1 | grep "step llama"
done
# FLOORS=1: where the 207M bf16-mixed step's time goes, per op, beside each op's floor (its
# FLOPs at the peak rate or its bytes at the peak bandwidth; PEAK_GBPS 4800 on an H200, 3350
# on an H100), float and 8da4w, with adam and with the multi-tensor adamw; then exit.
if [ -n "${FLOORS:-}" ]; then
  for opt in adam adamw; do
    echo "==== floors, optimizer $opt"
    timeout 200 "$build"/apps/qat steps --device cuda --model llama --precision bf16-mixed \
      --optimizer "$opt" --reps 20 --profile --floors --peak-gbps "${PEAK_GBPS:-4800}" 2>&1 |
      tee "$out/floors_$opt.log" | grep -v "^    node "
  done
  exit 0
fi
precision=${PRECISION:-bf16-mixed}
if [ -n "${COMPARE:-}" ]; then
  # The PTQ/QAT table: float trained $steps steps, then every recipe's PTQ and a QAT fine-tune
  # of QAT_STEPS beside a float fine-tune of the same steps. float.qgck (~1 GB) stays off $OUT.
  echo "==== ~100M decoder, --compare: $steps float steps, ${QAT_STEPS:-300} fine-tune steps, $precision, ${SEEDS:-1} seed(s)"
  t1=$(date +%s)
  timeout "${T_TRAIN:-500}" "$build"/apps/qat train --model llama --compare \
    --config examples/llama_100m_config.json --data "$data" "${QG_CORPUS_ARGS[@]}" \
    --out /tmp/lm_compare --device cuda --precision "$precision" --steps "$steps" \
    --qat-steps "${QAT_STEPS:-300}" --seeds "${SEEDS:-1}" --seq 512 --batch 8 --lr 1e-3 \
    --warmup 40 --eval-every "$steps" --eval-windows 64 >"$out/lm_compare.log" 2>&1
  echo "compare: rc=$? in $(($(date +%s) - t1)) s"
  cp /tmp/lm_compare/compare.csv /tmp/lm_compare/compare.json /tmp/lm_compare/curves.png "$out/" 2>/dev/null
  tail -12 "$out/lm_compare.log"
  exit 0
fi
echo "==== ~100M decoder on the Python documentation: $steps steps, batch 8 x 512, $precision"
for recipe in ${LM_RECIPES:-float 8da4w}; do
  args=()
  [ "$recipe" != float ] && args=(--recipe "$recipe")
  t1=$(date +%s)
  timeout "${T_TRAIN:-200}" "$build"/apps/qat train --model llama --config examples/llama_100m_config.json \
    --data "$data" "${QG_CORPUS_ARGS[@]}" --out "$out/lm_$recipe" --device cuda --steps "$steps" --seq 512 --batch 8 \
    --precision "$precision" --lr 1e-3 --warmup 40 --eval-every "$((steps / 2))" --eval-windows 64 "${args[@]}" \
    >"$out/lm_$recipe.log" 2>&1
  echo "$recipe: rc=$? in $(($(date +%s) - t1)) s"
  grep -E "parameters|unigram|validation loss|perplexity" "$out/lm_$recipe.log" | tail -4
done
