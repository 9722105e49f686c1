#!/usr/bin/env bash
# Configures and builds one build directory.
#   scripts/build.sh [build-dir] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
jobs=$(nproc 2>/dev/null || echo 2)
mkdir -p "$dir"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" > "$dir/configure.log" 2>&1 || {
  cat "$dir/configure.log"; exit 1; }
grep -E "qatgraph: CUDA" "$dir/configure.log" || true
cmake --build "$dir" -j "$jobs"
