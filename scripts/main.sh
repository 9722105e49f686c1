#!/usr/bin/env bash
# The main job: install what is missing, build, and run it: the gradient-check table, then
# `qat train --compare` (float32, PTQ and QAT rows over 5 seeds) for each model kind.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh build
./build/apps/qat gradcheck
for model in mlp cnn transformer; do
  ./build/apps/qat train --compare --model "$model" --out "out/compare-$model"
done
