#!/usr/bin/env bash
# The main job: install what is missing, build, and run it: the gradient-check table, then
# `qat train --compare` (float32, PTQ and QAT rows over 5 seeds) for each model kind, then a
# short CPU run of the tiny Llama on the Python documentation (its validation perplexity
# against the unigram baseline; about 50 s on two cores, 20 s of it tokenizing on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh build
./build/apps/qat gradcheck
for model in mlp cnn transformer; do
  ./build/apps/qat train --compare --model "$model" --out "out/compare-$model"
done
./build/apps/qat train --model llama --config tests/train/fixtures/llama_tiny_config.json \
  --data out/llama-data --out out/llama --device cpu --steps 600 --lr 3e-3 --eval-every 200 \
  --eval-windows 512
